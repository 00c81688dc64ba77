"""Everything meshpilot reads from and writes to a Kubernetes API server, started and stopped together.

* MeshConfig from ConfigMap ``istio`` (key ``mesh``) in the istio namespace;
* the registry kinds and Istio config of the local (config) cluster;
* remote clusters from multicluster Secrets;
* the status writer, on the leader of the ``istio-status-leader`` Lease.

The server is ready once the MeshConfig, every kind and the Secrets were
listed once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as kclient

from meshpilot.config.decode import Decoded
from meshpilot.config.file_source import ObjectSink
from meshpilot.kube.informer import Delivery, Informer, Pump, Resource
from meshpilot.kube.leader import STATUS_LEASE, LeaderElector, LeaseTimings
from meshpilot.kube.metrics import KubeMetrics
from meshpilot.kube.multicluster import MULTICLUSTER_LABEL, ClusterSecret, RemoteClusters, decode_secret
from meshpilot.kube.namespaces import NamespaceFilter, selectors_of
from meshpilot.kube.source import KubeSource
from meshpilot.kube.status import StatusWriter
from meshpilot.model.config import Config
from meshpilot.model.kind import Kind
from meshpilot.model.mesh import apply_mesh_config, default_mesh_config
from meshpilot.registry.kube.controller import KubeRegistry

log = logging.getLogger(__name__)

MESH_CONFIGMAP = "istio"
MESH_KEY = "mesh"


@dataclass(frozen=True, slots=True)
class KubeOptions:
    istio_namespace: str = "istio-system"
    cluster_id: str = "Kubernetes"
    lease: LeaseTimings = field(default_factory=LeaseTimings)
    #: Write status.observedGeneration on Istio config (PILOT_ENABLE_STATUS).
    enable_status: bool = False
    #: Lease holder name; the pod name by default.
    identity: str | None = None
    watch_timeout: tuple[int, int] | None = None
    #: How long readiness waits for remote clusters' initial lists (PILOT_REMOTE_CLUSTER_TIMEOUT);
    #: 0 does not wait for them at all.
    remote_cluster_timeout: float = 30.0
    #: Read MeshConfig from the ``istio`` ConfigMap; False when a mesh config file was given, which
    #: then wins (istiod uses its mesh file when one exists and watches the ConfigMap otherwise).
    watch_mesh: bool = True


def _decode_mesh(raw: dict[str, Any]) -> Any:
    """The ConfigMap's ``mesh`` key parsed over istiod's defaults (the defaults when it is empty)."""
    data = raw.get("data") or {}
    text = data.get(MESH_KEY) if isinstance(data, dict) else None
    return apply_mesh_config(str(text)) if text else default_mesh_config()


class _StatusSink:
    """Passes objects on and tells the status writer about Istio config."""

    def __init__(self, sink: ObjectSink, writer: StatusWriter) -> None:
        self._sink = sink
        self._writer = writer

    def upsert(self, obj: Decoded) -> None:
        self._sink.upsert(obj)
        if isinstance(obj, Config):
            self._writer.observe(obj)

    def remove(self, kind: Kind, namespace: str, name: str) -> None:
        self._sink.remove(kind, namespace, name)
        if kind.is_istio:
            self._writer.forget(kind.value, namespace, name)

    def batch(self) -> contextlib.AbstractContextManager[None]:
        return self._sink.batch()


class KubeController:
    def __init__(
        self,
        api: kclient.ApiClient,
        sink: ObjectSink,
        *,
        options: KubeOptions,
        metrics: KubeMetrics,
        on_mesh: Callable[[Any], None],
        make_registry: Callable[[str], KubeRegistry],
        attach: Callable[[KubeRegistry], None],
        detach: Callable[[KubeRegistry], None],
        mesh: Any = None,
        remote_sink: Callable[[KubeRegistry], ObjectSink] | None = None,
    ) -> None:
        self.api = api
        self.options = options
        self._on_mesh = on_mesh
        #: The MeshConfig in force; a given one (from a file) is used as is when the ConfigMap is not watched.
        self.mesh: Any = mesh
        self.status = StatusWriter(api) if options.enable_status else None
        self.source = KubeSource(
            api,
            _StatusSink(sink, self.status) if self.status is not None else sink,
            cluster=options.cluster_id,
            metrics=metrics,
            namespaces=NamespaceFilter(selectors_of(mesh) if mesh is not None else ()),
            watch_timeout=options.watch_timeout,
        )
        self.remotes = RemoteClusters(
            options.cluster_id,
            make_registry,
            attach,
            detach,
            metrics=metrics,
            selectors=self._selectors,
            watch_timeout=options.watch_timeout,
            sink=remote_sink,
        )
        self.elector = LeaderElector(
            api,
            options.istio_namespace,
            STATUS_LEASE,
            self._lead,
            identity=options.identity,
            timings=options.lease,
        )
        self._informers: list[Informer[Any]] = []
        self._mesh_synced = asyncio.Event()
        self._secrets_synced = asyncio.Event()
        self._stop = asyncio.Event()
        self._elector_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        options = self.options
        ns = options.istio_namespace

        def watch(resource: Resource, decode: Any, apply: Any) -> Informer[Any]:
            return Informer(
                self.api,
                resource,
                decode,
                Pump(loop, apply),
                cluster=options.cluster_id,
                watch_timeout=options.watch_timeout,
            )

        secrets = Resource("", "v1", "secrets", "Secret", ns, label_selector=f"{MULTICLUSTER_LABEL}=true")
        self._informers = [watch(secrets, decode_secret, self._apply_secrets)]
        if options.watch_mesh:
            configmap = Resource(
                "", "v1", "configmaps", "ConfigMap", ns, field_selector=f"metadata.name={MESH_CONFIGMAP}"
            )
            self._informers.append(watch(configmap, _decode_mesh, self._apply_mesh))
        else:
            self._mesh_synced.set()
        for informer in self._informers:
            informer.start()
        self.source.start()
        self._elector_task = asyncio.create_task(self.elector.run(self._stop), name="leader election")

    async def wait_synced(self) -> None:
        await self._mesh_synced.wait()
        await self._secrets_synced.wait()
        await self.source.wait_synced()
        await self._wait_remotes()

    async def _wait_remotes(self) -> None:
        """The remote clusters known at start, up to the timeout (after it, ready without them)."""
        timeout = self.options.remote_cluster_timeout
        pending = [c for c in self.remotes.clusters.values() if not c.source.synced]
        if not pending or timeout <= 0:
            return
        waits = [asyncio.create_task(c.source.wait_synced()) for c in pending]
        _, not_done = await asyncio.wait(waits, timeout=timeout)
        for task in not_done:
            task.cancel()
        late = [c.cluster_id for c in pending if not c.source.synced]
        if late:
            log.warning(
                "remote clusters %s not synced after %.0f s (PILOT_REMOTE_CLUSTER_TIMEOUT): ready anyway",
                ", ".join(sorted(late)),
                timeout,
            )

    async def stop(self) -> None:
        self._stop.set()
        if self._elector_task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._elector_task
        for informer in self._informers:
            informer.request_stop()
        for informer in self._informers:
            informer.join()
        self.source.stop()
        self.remotes.stop()

    async def _lead(self) -> None:
        if self.status is not None:
            await self.status.lead()
        else:
            await asyncio.Event().wait()  # nothing to write yet; hold the Lease until told to stop

    def _selectors(self) -> list[dict[str, Any]]:
        return selectors_of(self.mesh) if self.mesh is not None else []

    def _apply_mesh(self, batch: list[Delivery[Any]]) -> None:
        for delivery in batch:
            for change in delivery.changes:
                if change.deleted:
                    log.info("ConfigMap %s/%s deleted: back to the default MeshConfig", *change.name)
                    self._set_mesh(default_mesh_config())
                elif change.obj is None:
                    log.error(
                        "ConfigMap %s/%s key %s rejected: %s; the last valid MeshConfig stays",
                        *change.name,
                        MESH_KEY,
                        change.error,
                    )
                else:
                    self._set_mesh(change.obj)
            if delivery.listed and not self._mesh_synced.is_set():
                if self.mesh is None:
                    log.info(
                        "no ConfigMap %s/%s: using the default MeshConfig",
                        self.options.istio_namespace,
                        MESH_CONFIGMAP,
                    )
                    self._set_mesh(default_mesh_config())
                delivery.informer.synced = True
                self._mesh_synced.set()

    def _set_mesh(self, mesh: Any) -> None:
        if self.mesh is not None and mesh == self.mesh:
            return
        self.mesh = mesh
        selectors = selectors_of(mesh)
        self.source.set_discovery_selectors(selectors)
        self.remotes.set_discovery_selectors(selectors)
        self._on_mesh(mesh)

    def _apply_secrets(self, batch: list[Delivery[ClusterSecret]]) -> None:
        for delivery in batch:
            self.remotes.apply(delivery.changes)
            if delivery.listed and not self._secrets_synced.is_set():
                delivery.informer.synced = True
                self._secrets_synced.set()
