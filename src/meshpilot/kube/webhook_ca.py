"""The ``caBundle`` of Istio's webhook configurations, kept equal to the CA that signs the webhooks'
serving certificate, as istiod keeps it (``pkg/webhooks/webhookpatch.go`` for injection,
``pkg/webhooks/validation/controller`` for validation).

istiod selects the configurations by label, not by name: those labelled ``istio.io/rev`` with its
revision (``default`` for the default revision; the charts' ``istio-sidecar-injector``,
``istio-validator-istio-system`` and ``istiod-default-validator`` carry it). In a
MutatingWebhookConfiguration it patches the webhooks whose name ends in
``sidecar-injector.istio.io``; in a ValidatingWebhookConfiguration, every webhook. A configuration
someone edits is patched back; a new bundle (:meth:`WebhookCaPatcher.set_ca_bundle`) is patched
into all of them.

Where meshpilot differs: istiod's validation controller also turns ``failurePolicy: Ignore`` into
``Fail`` once a dry run shows its webhook rejects bad config; meshpilot leaves ``failurePolicy``
alone. A failed write is retried, as istiod retries it, until it succeeds (at most a minute apart).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import enum
import logging
from typing import Any

from kubernetes import client as kclient

from meshpilot.kube.client import KubeError, request_json, resource_path
from meshpilot.kube.informer import Delivery, Informer, Pump, Resource

log = logging.getLogger(__name__)

REVISION_LABEL = "istio.io/rev"
#: istiod's ``webhookName``: the suffix of the injection webhooks it patches.
INJECTION_WEBHOOK_SUFFIX = "sidecar-injector.istio.io"

#: Failed writes are retried for as long as they fail (an API server back after a minute must still
#: get the caBundle), at most this far apart; from this attempt on each failure is an error.
MAX_RETRY_DELAY = 60.0
LOUD_AFTER = 5
_RETRY_FIRST = 0.2
_STOP_TIMEOUT = 10.0
_GROUP, _VERSION = "admissionregistration.k8s.io", "v1"


class WebhookKind(enum.Enum):
    MUTATING = "mutatingwebhookconfigurations"
    VALIDATING = "validatingwebhookconfigurations"

    @property
    def kind(self) -> str:
        return (
            "MutatingWebhookConfiguration"
            if self is WebhookKind.MUTATING
            else "ValidatingWebhookConfiguration"
        )

    def patches(self, webhook_name: str) -> bool:
        return self is WebhookKind.VALIDATING or webhook_name.endswith(INJECTION_WEBHOOK_SUFFIX)


WebhookKey = tuple[WebhookKind, str]


def patched(kind: WebhookKind, configuration: dict[str, Any], ca_bundle: str) -> dict[str, Any] | None:
    """``configuration`` with ``ca_bundle`` (base64) in the webhooks istiod patches; None when nothing
    is to change (already equal, or no webhook of istiod's there)."""
    webhooks = configuration.get("webhooks") or []
    ours = [i for i, w in enumerate(webhooks) if isinstance(w, dict) and kind.patches(str(w.get("name", "")))]
    if all((webhooks[i].get("clientConfig") or {}).get("caBundle") == ca_bundle for i in ours):
        return None
    updated = copy.deepcopy(configuration)
    for i in ours:
        updated["webhooks"][i].setdefault("clientConfig", {})["caBundle"] = ca_bundle
    return updated


class WebhookCaPatcher:
    """Keeps ``caBundle`` in the revision's webhook configurations; ``start()`` in a running loop,
    ``await stop()`` at the end. Every method is called on the loop's thread. Every replica runs
    one, as in istiod (replicas with different bundles would fight, as istiods do)."""

    def __init__(
        self,
        api: kclient.ApiClient,
        ca_bundle_pem: str,
        *,
        revision: str = "default",
        kinds: tuple[WebhookKind, ...] = (WebhookKind.MUTATING, WebhookKind.VALIDATING),
        watch_timeout: tuple[int, int] | None = None,
    ) -> None:
        self.api = api
        self.revision = revision
        self.kinds = kinds
        self._bundle = _b64(ca_bundle_pem)
        self._watch_timeout = watch_timeout
        #: The configurations as last seen, raw.
        self._seen: dict[WebhookKey, dict[str, Any]] = {}
        self._queued: set[WebhookKey] = set()
        self._queue: asyncio.Queue[WebhookKey] = asyncio.Queue()
        self._attempts: dict[WebhookKey, int] = {}
        self._retries: set[asyncio.TimerHandle] = set()
        self._informers: list[Informer[Any]] = []
        self._synced = {kind: asyncio.Event() for kind in kinds}
        self._worker: asyncio.Task[None] | None = None
        self._stopping = False
        self._writing = False
        #: Configurations written (updates sent and accepted), for tests and debug.
        self.writes = 0

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for kind in self.kinds:
            resource = Resource(
                _GROUP, _VERSION, kind.value, kind.kind, label_selector=f"{REVISION_LABEL}={self.revision}"
            )

            def apply(batch: list[Delivery[dict[str, Any]]], kind: WebhookKind = kind) -> None:
                self._apply(kind, batch)

            self._informers.append(
                Informer(self.api, resource, dict, Pump(loop, apply), watch_timeout=self._watch_timeout)
            )
        for informer in self._informers:
            informer.start()
        self._worker = asyncio.create_task(self._work(), name="webhook caBundle patcher")

    async def wait_synced(self) -> None:
        for event in self._synced.values():
            await event.wait()

    async def stop(self) -> None:
        """Stop the informers and the writer (a write under way finishes first). Idempotent."""
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
                await asyncio.wait_for(self._worker, _STOP_TIMEOUT)
            self._worker = None
        for informer in self._informers:
            await asyncio.to_thread(informer.join)

    def set_ca_bundle(self, ca_bundle_pem: str) -> None:
        """A new bundle (PEM): every configuration follows it."""
        bundle = _b64(ca_bundle_pem)
        if bundle == self._bundle:
            return
        self._bundle = bundle
        for key in self._seen:
            self._enqueue(key)

    def _apply(self, kind: WebhookKind, batch: list[Delivery[dict[str, Any]]]) -> None:
        for delivery in batch:
            for change in delivery.changes:
                key = (kind, change.name[1])
                if change.obj is None:
                    self._seen.pop(key, None)
                else:
                    self._seen[key] = change.obj
                    self._enqueue(key)
            if delivery.listed:
                delivery.informer.synced = True
                self._synced[kind].set()

    def _enqueue(self, key: WebhookKey) -> None:
        if self._stopping or key in self._queued:
            return
        self._queued.add(key)
        self._queue.put_nowait(key)

    async def _work(self) -> None:
        while not self._stopping:
            key = await self._queue.get()
            self._queued.discard(key)
            current = self._seen.get(key)
            update = patched(key[0], current, self._bundle) if current is not None else None
            if update is None:
                self._attempts.pop(key, None)
                continue
            self._writing = True
            try:
                await asyncio.to_thread(self._write, key, update)
            except KubeError as err:
                self._retry(key, err)
            else:
                self._attempts.pop(key, None)
            finally:
                self._writing = False

    def _write(self, key: WebhookKey, update: dict[str, Any]) -> None:
        """Runs on a thread: replace the configuration as last seen (its resourceVersion guards it)."""
        kind, name = key
        try:
            request_json(self.api, "PUT", resource_path(_GROUP, _VERSION, kind.value, "", name), body=update)
        except KubeError as err:
            # 409: changed since it was seen, and its informer event brings the newer one to patch;
            # 404: deleted meanwhile.
            if err.status in (404, 409):
                log.info("%s %s not patched: %s", kind.kind, name, err)
                return
            raise
        self.writes += 1
        log.info("%s %s: caBundle patched", kind.kind, name)

    def _retry(self, key: WebhookKey, err: KubeError) -> None:
        attempts = self._attempts.get(key, 0) + 1
        self._attempts[key] = attempts
        level = logging.ERROR if attempts >= LOUD_AFTER else logging.WARNING
        log.log(
            level, "%s %s not patched (%d attempts): %s; trying again", key[0].kind, key[1], attempts, err
        )

        def again() -> None:
            self._retries.discard(handle)
            self._enqueue(key)

        delay = min(_RETRY_FIRST * 2 ** min(attempts - 1, 20), MAX_RETRY_DELAY)
        handle = asyncio.get_running_loop().call_later(delay, again)
        self._retries.add(handle)


def _b64(pem: str) -> str:
    return base64.b64encode(pem.encode()).decode()
