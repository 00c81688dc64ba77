"""The Kubernetes API as a config source: an informer per kind, applied to an ObjectSink.

Objects are decoded exactly as the config directory decodes them
(``decode_object``) and go to the same sink, so one object gives one Envoy
config whichever way it arrives. Like the directory, an object that fails to
decode is reported with its reason and the last valid version stays in
place.

Objects of namespaces the discovery selectors leave out are kept here but not
applied; when a namespace comes into or leaves the selection they are applied
or removed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kubernetes import client as kclient

from meshpilot.config.core_objects import KubeNamespace
from meshpilot.config.decode import Decoded, decode_object
from meshpilot.config.file_source import ObjectSink, Rejection
from meshpilot.config.schemas import SCHEMAS
from meshpilot.kube.informer import Delivery, Informer, Pump, Resource
from meshpilot.kube.metrics import KubeMetrics
from meshpilot.kube.namespaces import NamespaceFilter
from meshpilot.model.kind import Kind

log = logging.getLogger(__name__)

#: What istiod's Kubernetes registry watches in every cluster.
REGISTRY_KINDS = (Kind.NAMESPACE, Kind.NODE, Kind.SERVICE, Kind.ENDPOINT_SLICE, Kind.POD)
#: Istio config read from the config cluster.
CONFIG_KINDS = (
    Kind.VIRTUAL_SERVICE,
    Kind.DESTINATION_RULE,
    Kind.GATEWAY,
    Kind.SERVICE_ENTRY,
    Kind.WORKLOAD_ENTRY,
    Kind.WORKLOAD_GROUP,
    Kind.SIDECAR,
    Kind.ENVOY_FILTER,
    Kind.PEER_AUTHENTICATION,
    Kind.AUTHORIZATION_POLICY,
    Kind.REQUEST_AUTHENTICATION,
    Kind.TELEMETRY,
)

#: The Secrets SDS serves (credentialName), of the config cluster.
SECRET_KINDS = (Kind.SECRET,)
#: istiod's SecretsFieldSelector: Helm releases and service-account tokens are never TLS credentials,
#: and in a large cluster they are most Secrets; left out, they cost neither memory nor decoding.
SECRETS_FIELD_SELECTOR = "type!=helm.sh/release.v1,type!=kubernetes.io/service-account-token"

ObjectKey = tuple[Kind, str, str]


def resource_of(kind: Kind) -> Resource:
    schema = SCHEMAS[kind]
    selector = SECRETS_FIELD_SELECTOR if kind is Kind.SECRET else ""
    return Resource(schema.group, schema.versions[0], schema.plural, kind.value, field_selector=selector)


def _same(old: Decoded, new: Decoded) -> bool:
    """Equal but for metadata.resourceVersion."""
    if old.meta.resource_version == new.meta.resource_version:
        return old == new
    loose: Any = new
    same_version = dataclasses.replace(loose.meta, resource_version=old.meta.resource_version)
    return bool(old == dataclasses.replace(loose, meta=same_version))


def _decode(raw: dict[str, Any]) -> Decoded:
    result = decode_object(raw)
    for warning in result.warnings:
        meta = raw.get("metadata") or {}
        log.warning("kube %s %s/%s: %s", raw.get("kind"), meta.get("namespace"), meta.get("name"), warning)
    return result.obj


@dataclass(slots=True)
class _Entry:
    obj: Decoded
    applied: bool


class KubeSource:
    """Lists and watches ``kinds`` in one cluster and keeps ``sink`` equal to what the API holds."""

    def __init__(
        self,
        api: kclient.ApiClient,
        sink: ObjectSink,
        *,
        kinds: Iterable[Kind] = (*REGISTRY_KINDS, *CONFIG_KINDS, *SECRET_KINDS),
        cluster: str = "Kubernetes",
        metrics: KubeMetrics | None = None,
        namespaces: NamespaceFilter | None = None,
        watch_timeout: tuple[int, int] | None = None,
    ) -> None:
        self.cluster = cluster
        self._api = api
        self._sink = sink
        self._kinds = tuple(kinds)
        self._metrics = metrics
        self.namespaces = namespaces or NamespaceFilter()
        self._watch_timeout = watch_timeout
        self._objects: dict[ObjectKey, _Entry] = {}
        self._by_namespace: dict[str, set[ObjectKey]] = defaultdict(set)
        self._rejections: dict[ObjectKey, str] = {}
        self.informers: dict[Informer[Decoded], Kind] = {}
        self._synced = asyncio.Event()
        self._stopped = False

    @property
    def rejections(self) -> list[Rejection]:
        return [
            Rejection(f"kube cluster {self.cluster}", f"{kind.value} {ns + '/' if ns else ''}{name}", reason)
            for (kind, ns, name), reason in sorted(
                self._rejections.items(), key=lambda i: (i[0][0].value, i[0][1:])
            )
        ]

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    def start(self) -> None:
        pump = Pump(asyncio.get_running_loop(), self._apply)
        for kind in self._kinds:
            informer: Informer[Decoded] = Informer(
                self._api,
                resource_of(kind),
                _decode,
                pump,
                cluster=self.cluster,
                watch_timeout=self._watch_timeout,
            )
            self.informers[informer] = kind
        for informer in self.informers:
            informer.start()

    def stop(self) -> None:
        """Stop every informer; deliveries still on their way are dropped."""
        self._stopped = True
        for informer in self.informers:
            informer.request_stop()  # all at once, then wait for each
        for informer in self.informers:
            informer.join()

    def remove_all(self) -> None:
        """Take everything this source applied out of the sink (its cluster went away)."""
        with self._sink.batch():
            for key, entry in list(self._objects.items()):
                if entry.applied:
                    self._sink.remove(*key)
        self._objects.clear()
        self._by_namespace.clear()

    def set_discovery_selectors(self, selectors: list[dict[str, Any]]) -> None:
        if not self.namespaces.differs(selectors):
            return  # any other MeshConfig change
        changed = self.namespaces.set_selectors(selectors)
        # Also the namespaces whose objects the filter now judges otherwise though their membership
        # did not change as the filter sees it: those whose Namespace was not listed yet, whose objects
        # were applied or held back under the selectors of their time (at start the lists of Services,
        # Namespaces and the ConfigMap come in any order).
        changed |= self._out_of_date(self._by_namespace.keys() - changed)
        if changed:
            with self._sink.batch():
                self._refilter(changed)

    # -- applying deliveries (on the loop) ----------------------------------------

    def _apply(self, batch: list[Delivery[Decoded]]) -> None:
        if self._stopped:
            return
        with self._sink.batch():
            for delivery in batch:
                kind = self.informers[delivery.informer]
                refilter: set[str] = set()
                for change in delivery.changes:
                    namespace, name = change.name
                    key = (kind, namespace, name)
                    if change.deleted:
                        self._delete(key)
                        if kind is Kind.NAMESPACE and self.namespaces.set_namespace(name, None):
                            refilter.add(name)
                    elif change.obj is None:
                        self._reject(key, change.error)
                    else:
                        self._upsert(key, change.obj)
                        if isinstance(change.obj, KubeNamespace) and self.namespaces.set_namespace(
                            name, change.obj.meta.labels
                        ):
                            refilter.add(name)
                if refilter:
                    self._refilter(refilter)
                if delivery.listed and not delivery.informer.synced:
                    delivery.informer.synced = True
                    if all(informer.synced for informer in self.informers):
                        log.info(
                            "kube cluster %s: initial lists synced (%d objects)",
                            self.cluster,
                            len(self._objects),
                        )
                        self._synced.set()

    def _upsert(self, key: ObjectKey, obj: Decoded) -> None:
        self._rejections.pop(key, None)
        entry = self._objects.get(key)
        self._count(key[0], "update" if entry is not None else "add")
        applied = self.namespaces.allows(key[1])
        if applied and entry is not None and entry.applied and _same(entry.obj, obj):
            pass  # only the resourceVersion moved (a status write): nothing to recompute or push
        elif applied:
            self._sink.upsert(obj)
        elif entry is not None and entry.applied:
            self._sink.remove(*key)
        self._objects[key] = _Entry(obj, applied)
        self._by_namespace[key[1]].add(key)

    def _delete(self, key: ObjectKey) -> None:
        self._rejections.pop(key, None)
        entry = self._objects.pop(key, None)
        if entry is None:
            return
        self._count(key[0], "delete")
        self._by_namespace[key[1]].discard(key)
        if entry.applied:
            self._sink.remove(*key)

    def _reject(self, key: ObjectKey, reason: str) -> None:
        kind, namespace, name = key
        self._rejections[key] = reason
        kept = " (the last valid version stays)" if key in self._objects else ""
        log.error(
            "kube cluster %s: %s %s/%s rejected: %s%s",
            self.cluster,
            kind.value,
            namespace,
            name,
            reason,
            kept,
        )

    def _out_of_date(self, namespaces: Iterable[str]) -> set[str]:
        """Those of ``namespaces`` holding an object applied that the filter now holds back, or held
        back that it now lets through."""
        out = set()
        for namespace in namespaces:
            allowed = self.namespaces.allows(namespace)
            if any(self._objects[key].applied != allowed for key in self._by_namespace.get(namespace, ())):
                out.add(namespace)
        return out

    def _refilter(self, namespaces: set[str]) -> None:
        for namespace in sorted(namespaces):
            allowed = self.namespaces.allows(namespace)
            for key in sorted(self._by_namespace.get(namespace, ()), key=lambda k: (k[0].value, k[2])):
                entry = self._objects[key]
                if allowed and not entry.applied:
                    self._sink.upsert(entry.obj)
                elif not allowed and entry.applied:
                    self._sink.remove(*key)
                entry.applied = allowed
            log.info(
                "kube cluster %s: namespace %s is %s",
                self.cluster,
                namespace,
                "discovered" if allowed else "not discovered",
            )

    def _count(self, kind: Kind, event: str) -> None:
        if self._metrics is not None:
            self._metrics.event(kind, event)
