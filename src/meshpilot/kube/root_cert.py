"""The ``istio-ca-root-cert`` ConfigMap in every watched namespace, as istiod's namespace controller
keeps it (``pilot/pkg/serviceregistry/kube/controller/namespacecontroller.go``).

Each namespace that exists, is not terminating, is not one of Kubernetes' own (``kube-public``,
``kube-node-lease``, ``local-path-storage``; ``kube-system`` is served) and is selected by the
mesh's ``discoverySelectors`` holds a ConfigMap ``istio-ca-root-cert`` labelled
``istio.io/config: "true"`` whose key ``root-cert.pem`` is the mesh's roots. Proxies' agents read it
to trust the CA. The ConfigMap is made when missing (also after someone deletes it), and its key is
set back when it differs (someone edited it, or the root changed: :meth:`RootCertPublisher.set_root`);
other keys and labels are left as they are, as istiod leaves them. Namespaces that are not selected
are left alone: nothing is made there and nothing is removed.

Two informers (Namespaces, and ConfigMaps of that name in all namespaces) feed the loop, which
keeps what they saw and queues namespaces to reconcile; one worker writes, from a thread, one
namespace at a time. A failed write is tried again after 0.2, 0.4, … s, at most a minute apart, until
it succeeds, as istiod's queue does.

With replicas, one writes: given ``lease_namespace``, the publisher runs only while its replica holds
the Lease ``istio-namespace-controller-election`` there, as istiod runs its namespace controller only
on the leader of the election of that name; a new leader lists afresh and makes what is missing.
Where meshpilot differs: istiod holds that election on a ConfigMap lock (a ConfigMap of the same name,
the record in an annotation), meshpilot on a Lease, so istiod and meshpilot replicas running side by
side would each elect a leader (docs/deploy.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client as kclient
from prometheus_client import CollectorRegistry, Counter

from meshpilot.kube.client import KubeError, request_json, resource_path
from meshpilot.kube.informer import Delivery, Informer, Pump, Resource
from meshpilot.kube.leader import NAMESPACE_CONTROLLER_LEASE, LeaderElector, LeaseTimings
from meshpilot.kube.namespaces import NamespaceFilter

log = logging.getLogger(__name__)

ROOT_CERT_CONFIGMAP = "istio-ca-root-cert"
ROOT_CERT_KEY = "root-cert.pem"
#: istiod's ``configMapLabel``.
ROOT_CERT_LABELS = {"istio.io/config": "true"}
#: istiod's ``inject.IgnoredNamespaces`` less ``kube-system`` (served, for ztunnel).
IGNORED_NAMESPACES = frozenset({"kube-public", "kube-node-lease", "local-path-storage"})

#: Failed writes are retried for as long as they fail (a namespace without its root leaves injected pods
#: waiting), at most this far apart; from this attempt on each failure is an error.
MAX_RETRY_DELAY = 60.0
LOUD_AFTER = 5
_RETRY_FIRST = 0.2
_STOP_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class _Namespace:
    labels: dict[str, str]
    terminating: bool


def _decode_namespace(raw: dict[str, Any]) -> _Namespace:
    meta = raw.get("metadata") or {}
    labels = meta.get("labels") or {}
    phase = (raw.get("status") or {}).get("phase")
    return _Namespace({str(k): str(v) for k, v in labels.items()}, phase == "Terminating")


def _decode_configmap(raw: dict[str, Any]) -> str | None:
    """The ConfigMap's ``root-cert.pem`` (None when it has no such key)."""
    data = raw.get("data") or {}
    value = data.get(ROOT_CERT_KEY) if isinstance(data, dict) else None
    return str(value) if value is not None else None


class RootCertMetrics:
    """``meshpilot_root_cert_configmap_writes_total{operation="create"|"update"}``: ConfigMaps written."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.writes = Counter(
            "meshpilot_root_cert_configmap_writes",
            "istio-ca-root-cert ConfigMaps created or updated.",
            ["operation"],
            registry=registry,
        )


class RootCertPublisher:
    """Keeps ``istio-ca-root-cert`` in the selected namespaces; ``start()`` in a running loop,
    ``await stop()`` at the end. Every method is called on the loop's thread.

    With ``lease_namespace`` it writes only while this replica leads the namespace controller
    election (``lease`` timings, istiod's by default; ``identity`` as the Lease holder, the pod
    name by default); each term starts from a fresh list. Without it, it writes from ``start`` on.
    """

    def __init__(
        self,
        api: kclient.ApiClient,
        root_pem: str,
        *,
        selectors: Sequence[Mapping[str, Any]] = (),
        registry: CollectorRegistry | None = None,
        watch_timeout: tuple[int, int] | None = None,
        lease_namespace: str | None = None,
        lease: LeaseTimings | None = None,
        identity: str | None = None,
    ) -> None:
        self.api = api
        self.metrics = RootCertMetrics(registry)
        self._root = root_pem
        self._filter = NamespaceFilter(selectors)
        self._watch_timeout = watch_timeout
        self.elector = (
            None
            if lease_namespace is None
            else LeaderElector(
                api,
                lease_namespace,
                NAMESPACE_CONTROLLER_LEASE,
                self._lead,
                identity=identity,
                timings=lease or LeaseTimings(),
            )
        )
        self._elector_stop = asyncio.Event()
        self._elector_task: asyncio.Task[None] | None = None
        #: Every namespace the informer listed, terminating or not, selected or not.
        self._namespaces: dict[str, _Namespace] = {}
        #: The ``root-cert.pem`` of each ConfigMap seen ("" when the key is missing).
        self._configmaps: dict[str, str] = {}
        #: Namespaces waiting in ``_queue``; a namespace is in the queue at most once.
        self._queued: set[str] = set()
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._attempts: dict[str, int] = {}
        self._retries: set[asyncio.TimerHandle] = set()
        self._informers: list[Informer[Any]] = []
        self._worker: asyncio.Task[None] | None = None
        self._synced = {"namespaces": asyncio.Event(), "configmaps": asyncio.Event()}
        self._stopping = False
        #: A write is under way on a thread: stop lets it finish.
        self._writing = False

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> None:
        if self.elector is None:
            self._begin()
        else:
            self._elector_task = asyncio.create_task(
                self.elector.run(self._elector_stop), name=f"leader election {NAMESPACE_CONTROLLER_LEASE}"
            )

    async def _lead(self) -> None:
        """One term as leader: write until cancelled (the Lease lost, or stopping)."""
        self._begin()
        try:
            await asyncio.Event().wait()
        finally:
            await self._end()

    def _begin(self) -> None:
        """Informers and writer from scratch: what an earlier term saw may be stale."""
        self._namespaces.clear()
        self._configmaps.clear()
        self._queued.clear()
        self._queue = asyncio.Queue()
        self._attempts.clear()
        self._synced = {"namespaces": asyncio.Event(), "configmaps": asyncio.Event()}
        self._stopping = False
        loop = asyncio.get_running_loop()
        namespaces = Resource("", "v1", "namespaces", "Namespace")
        configmaps = Resource(
            "", "v1", "configmaps", "ConfigMap", field_selector=f"metadata.name={ROOT_CERT_CONFIGMAP}"
        )
        self._informers = [
            Informer(
                self.api,
                namespaces,
                _decode_namespace,
                Pump(loop, self._apply_namespaces),
                watch_timeout=self._watch_timeout,
            ),
            Informer(
                self.api,
                configmaps,
                _decode_configmap,
                Pump(loop, self._apply_configmaps),
                watch_timeout=self._watch_timeout,
            ),
        ]
        for informer in self._informers:
            informer.start()
        self._worker = asyncio.create_task(self._work(), name="istio-ca-root-cert writer")

    async def wait_synced(self) -> None:
        """Until both informers listed once (the queue may still hold writes)."""
        for event in self._synced.values():
            await event.wait()

    async def stop(self) -> None:
        """Stop the informers and the writer (a write under way finishes first), and release the Lease
        if held. Idempotent."""
        if self._elector_task is not None:
            self._elector_stop.set()
            with contextlib.suppress(asyncio.CancelledError):
                await self._elector_task
            self._elector_task = None
        await self._end()

    async def _end(self) -> None:
        self._stopping = True
        for handle in self._retries:
            handle.cancel()
        self._retries.clear()
        for informer in self._informers:
            informer.request_stop()
        if self._worker is not None:
            if not self._writing:
                self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                # A write under way ends within its request timeout; the worker returns after it.
                await asyncio.wait_for(self._worker, _STOP_TIMEOUT)
            self._worker = None
        for informer in self._informers:
            await asyncio.to_thread(informer.join)

    # -- inputs ---------------------------------------------------------------

    def set_root(self, root_pem: str) -> None:
        """A new root bundle: every selected namespace's ConfigMap follows it."""
        if root_pem == self._root:
            return
        self._root = root_pem
        for namespace in self._namespaces:
            self._enqueue(namespace)

    def set_discovery_selectors(self, selectors: Sequence[Mapping[str, Any]]) -> None:
        """MeshConfig's discoverySelectors changed: namespaces newly selected get their ConfigMap."""
        for namespace in self._filter.set_selectors(selectors):
            self._enqueue(namespace)

    def selected(self, namespace: str) -> bool:
        """Whether ``namespace`` should hold the ConfigMap now."""
        state = self._namespaces.get(namespace)
        return (
            state is not None
            and not state.terminating
            and namespace not in IGNORED_NAMESPACES
            and self._filter.allows(namespace)
        )

    def _apply_namespaces(self, batch: list[Delivery[_Namespace]]) -> None:
        for delivery in batch:
            for change in delivery.changes:
                namespace = change.name[1]
                if change.obj is None:
                    self._namespaces.pop(namespace, None)
                    self._filter.set_namespace(namespace, None)
                    continue
                self._namespaces[namespace] = change.obj
                self._filter.set_namespace(namespace, change.obj.labels)
                self._enqueue(namespace)
            if delivery.listed:
                delivery.informer.synced = True
                self._synced["namespaces"].set()

    def _apply_configmaps(self, batch: list[Delivery[str | None]]) -> None:
        for delivery in batch:
            for change in delivery.changes:
                namespace = change.name[0]
                if change.deleted:
                    self._configmaps.pop(namespace, None)
                else:
                    self._configmaps[namespace] = change.obj or ""
                self._enqueue(namespace)
            if delivery.listed:
                delivery.informer.synced = True
                self._synced["configmaps"].set()

    # -- the writer -----------------------------------------------------------

    def _enqueue(self, namespace: str) -> None:
        if self._stopping or namespace in self._queued or not self.selected(namespace):
            return
        self._queued.add(namespace)
        self._queue.put_nowait(namespace)

    async def _work(self) -> None:
        await self.wait_synced()  # decide from complete state, or a ConfigMap would be made twice
        while not self._stopping:
            namespace = await self._queue.get()
            self._queued.discard(namespace)
            if not self.selected(namespace):
                continue
            operation = self._due(namespace)
            if operation is None:
                self._attempts.pop(namespace, None)
                continue
            self._writing = True
            try:
                await asyncio.to_thread(self._write, operation, namespace, self._root)
            except KubeError as err:
                self._retry(namespace, err)
            else:
                self._attempts.pop(namespace, None)
            finally:
                self._writing = False

    def _due(self, namespace: str) -> str | None:
        current = self._configmaps.get(namespace)
        if current is None:
            return "create"
        return "update" if current != self._root else None

    def _write(self, operation: str, namespace: str, root: str) -> None:
        """Runs on a thread: create the ConfigMap or set its key (other keys kept)."""
        path = resource_path("", "v1", "configmaps", namespace)
        try:
            if operation == "create":
                body = {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {
                        "name": ROOT_CERT_CONFIGMAP,
                        "namespace": namespace,
                        "labels": dict(ROOT_CERT_LABELS),
                    },
                    "data": {ROOT_CERT_KEY: root},
                }
                request_json(self.api, "POST", path, body=body)
            else:
                # Read and replace (its resourceVersion guards it), as istiod updates it: istiod's
                # ClusterRole, which meshpilot's keeps within, grants configmaps `update`, not `patch`.
                current = request_json(self.api, "GET", f"{path}/{ROOT_CERT_CONFIGMAP}")
                current.setdefault("data", {})[ROOT_CERT_KEY] = root
                request_json(self.api, "PUT", f"{path}/{ROOT_CERT_CONFIGMAP}", body=current)
        except KubeError as err:
            # 409: made, or changed, meanwhile (its informer event brings it back here); 404 on
            # update: deleted meanwhile (its event brings a create); 403 or 404 on create: no
            # permission, or the namespace is terminating or gone. None of these is worth a retry,
            # as for istiod.
            if err.status in (403, 404, 409):
                log.info("ConfigMap %s/%s not written: %s", namespace, ROOT_CERT_CONFIGMAP, err)
                return
            raise
        self.metrics.writes.labels(operation=operation).inc()
        log.info("ConfigMap %s/%s: %s", namespace, ROOT_CERT_CONFIGMAP, operation)

    def _retry(self, namespace: str, err: KubeError) -> None:
        attempts = self._attempts.get(namespace, 0) + 1
        self._attempts[namespace] = attempts
        level = logging.ERROR if attempts >= LOUD_AFTER else logging.WARNING
        log.log(
            level,
            "ConfigMap %s/%s not written (%d attempts): %s; trying again",
            namespace,
            ROOT_CERT_CONFIGMAP,
            attempts,
            err,
        )

        def again() -> None:
            self._retries.discard(handle)
            self._enqueue(namespace)

        delay = min(_RETRY_FIRST * 2 ** min(attempts - 1, 20), MAX_RETRY_DELAY)
        handle = asyncio.get_running_loop().call_later(delay, again)
        self._retries.add(handle)
