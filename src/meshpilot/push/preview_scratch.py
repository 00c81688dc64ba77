"""The scratch copy a change preview works on (``preview.py``): the live server's config, services
and endpoint index copied, the change applied to the copy, and the two private PushContexts (before
and with the change) built from it, in slices of the event loop, without touching the live server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from meshpilot.config.store import ConfigStore, KindView
from meshpilot.model.config import ConfigKey
from meshpilot.model.endpoint import Endpoint
from meshpilot.model.endpoint_index import EndpointIndex, PushType, ShardKey
from meshpilot.model.jwks import JwksLookup
from meshpilot.model.kind import Kind
from meshpilot.model.push_context import PushContext
from meshpilot.model.push_request import (
    PushRequest,
    TriggerReason,
    config_request,
    merge_all,
    registry_request,
)
from meshpilot.model.service import Service
from meshpilot.push.environment import MeshEnvironment
from meshpilot.push.jwks_resolver import JwksResolver
from meshpilot.push.preview_change import Change
from meshpilot.registry.aggregate import AggregateRegistry
from meshpilot.registry.serviceentry.controller import PodHandler, PodSource, ServiceEntryRegistry
from meshpilot.xds.cache import XdsCache
from meshpilot.xds.connection import Connection
from meshpilot.xds.server import DiscoveryServer

#: How long one slice of work may hold the event loop before it yields.
SLICE_SECONDS = 0.02


@dataclass(frozen=True, slots=True)
class PreviewSources:
    """What a preview reads of the running server; it writes to none of it."""

    server: DiscoveryServer
    env: MeshEnvironment
    service_entries: ServiceEntryRegistry
    #: Kinds that reach proxies through the ServiceEntry registry rather than as config pushes (the
    #: server's own set): a change to one is replayed through a scratch registry.
    registry_kinds: frozenset[Kind]
    pods: PodSource | None = None
    #: The connected proxies when they are not the server's own (a push-worker pool's main process
    #: asks its workers: ``pool.preview_connections``), each with its proxy's state as the live
    #: model gives it; None reads ``server.connections``.
    connections: Callable[[str], Awaitable[list[Connection]]] | None = None


class _ReadOnlyPods:
    """The live Pods, for a scratch ServiceEntryRegistry: read, never followed."""

    def __init__(self, pods: PodSource) -> None:
        self._pods = pods

    def pods_in(self, namespace: str) -> list[Any]:
        return self._pods.pods_in(namespace)

    def pod_workload_locality(self, pod: Any) -> str:
        return self._pods.pod_workload_locality(pod)

    def add_pod_handler(self, handler: PodHandler) -> None:
        pass  # the scratch registry lives for one preview


class _ScratchUpdater:
    """The XdsUpdater of the scratch registry: endpoints go to the copied index, and the push
    requests the live server would be sent are kept (built as the server's ``eds_update`` and
    ``service_update`` build them: ``registry_request``)."""

    def __init__(self, index: EndpointIndex) -> None:
        self.index = index
        self.recording = False
        self.requests: list[PushRequest] = []

    def config_update(self, request: PushRequest) -> None:
        if self.recording:
            self.requests.append(request)

    def eds_update(
        self, shard: ShardKey, hostname: str, namespace: str, endpoints: list[Endpoint] | Any
    ) -> None:
        push_type = self.index.update_service_endpoints(shard, hostname, namespace, endpoints)
        if push_type is PushType.NO_PUSH or not self.recording:
            return
        key = ConfigKey(Kind.SERVICE_ENTRY, hostname, namespace)
        self.requests.append(registry_request(key, TriggerReason.ENDPOINT, full=push_type is PushType.FULL))

    def service_update(self, shard: ShardKey, hostname: str, namespace: str, deleted: bool) -> None:
        if deleted:
            self.index.delete_service_shard(shard, hostname, namespace)
        if self.recording:
            key = ConfigKey(Kind.SERVICE_ENTRY, hostname, namespace)
            self.requests.append(registry_request(key, TriggerReason.SERVICE))

    def proxy_update(self, cluster_id: str, ip: str) -> None:
        pass


class _KnownJwks:
    """The JWKS the live resolver already holds, for the preview's snapshots. Asking the resolver
    itself would register a source to fetch and an owner to push: a preview must make the server
    neither fetch nor push. A source it does not know yet is generated as the push would before its
    keys arrive (failing closed)."""

    def __init__(self, live: JwksLookup | None) -> None:
        self._live = live

    def jwks(self, uri: str, issuer: str, timeout_s: float, owner: ConfigKey) -> str | None:
        return self._live.known(uri, issuer) if isinstance(self._live, JwksResolver) else None


def copy_index(live: EndpointIndex) -> EndpointIndex:
    """A copy of ``live`` (the endpoint tuples are immutable and shared)."""
    out = EndpointIndex()
    for hostname, namespace, shards in live.services():
        if not shards.shards:
            out.update_service_endpoints(ShardKey("", ""), hostname, namespace, ())
        for key, endpoints in shards.shards.items():
            out.update_service_endpoints(key, hostname, namespace, endpoints)
    return out


@dataclass(slots=True)
class Snapshots:
    before: PushContext
    after: PushContext
    before_env: MeshEnvironment
    after_env: MeshEnvironment
    index_before: EndpointIndex
    index_after: EndpointIndex
    request: PushRequest | None
    #: Private XdsCaches, one per snapshot (None when the server runs without one): proxies share
    #: route configurations through it as they do in a push.
    cache_before: XdsCache | None = None
    cache_after: XdsCache | None = None


class Slicer:
    """Yields the event loop once a slice of work has used ``SLICE_SECONDS``; keeps the longest."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.longest = 0.0

    async def pause(self, *, always: bool = False) -> None:
        now = time.monotonic()
        if always or now - self.started >= SLICE_SECONDS:
            self.longest = max(self.longest, now - self.started)
            await asyncio.sleep(0)
            self.started = time.monotonic()

    def end(self) -> None:
        self.longest = max(self.longest, time.monotonic() - self.started)


class _FrozenStore(ConfigStore):
    """A store whose snapshot is the one taken when the preview started."""

    def __init__(self, snapshot: Mapping[Kind, KindView]) -> None:
        super().__init__()
        self._frozen = dict(snapshot)

    def snapshot(self) -> dict[Kind, KindView]:
        return dict(self._frozen)


class _FixedServices(AggregateRegistry):
    """The live registries for what a proxy refresh asks (workload labels, service targets), with
    the services fixed when the preview started (plus the scratch ServiceEntry registry's)."""

    def __init__(self, live: AggregateRegistry, services: Callable[[], list[Service]]) -> None:
        super().__init__(live.workloads, live.others)
        self._services = services

    def services(self) -> list[Service]:
        return self._services()


async def scratch(sources: PreviewSources, change: Change, slicer: Slicer) -> Snapshots:
    env = sources.env
    live_se = sources.service_entries
    # Everything read of the live server is taken now, before the first yield: what it holds then is
    # what both snapshots start from, whatever changes while the preview runs.
    snapshot = env.store.snapshot()
    by_registry = [(r, r.services()) for r in (*env.registry.workloads, *env.registry.others)]
    mesh = env.mesh
    index_before = copy_index(env.index)
    await slicer.pause()
    touched = {c.meta.kind for c in change.upserts} | {k.kind for k in change.deletes}
    registry_kinds = sources.registry_kinds
    via_registry = bool(touched & registry_kinds)
    store = ConfigStore()
    updater = _ScratchUpdater(copy_index(index_before) if via_registry else index_before)
    scratch_se: ServiceEntryRegistry | None = None
    if via_registry:
        pods = _ReadOnlyPods(sources.pods) if sources.pods is not None else None
        scratch_se = ServiceEntryRegistry(
            store, updater, cluster_id=live_se.cluster_id, trust_domain=live_se.trust_domain, pods=pods
        )

    def services_after() -> list[Service]:
        out: list[Service] = []
        for registry, services in by_registry:
            out += scratch_se.services() if scratch_se is not None and registry is live_se else services
        return out

    for count, config in enumerate(c for view in snapshot.values() for c in view.values()):
        store.upsert(config)
        if count % 256 == 255:
            await slicer.pause()
    requests: list[PushRequest] = []
    updater.recording = True
    for config in change.upserts:
        event = store.upsert(config)
        if event is not None and config.meta.kind not in registry_kinds:
            requests.append(config_request(config.key))
    for key in change.deletes:
        event = store.delete(key)
        if event is not None and key.kind not in registry_kinds:
            requests.append(config_request(key))
    requests += updater.requests
    await slicer.pause()
    jwks = _KnownJwks(env.jwks)

    def environment(
        config: ConfigStore, services: Callable[[], list[Service]], index: EndpointIndex
    ) -> MeshEnvironment:
        scratch = MeshEnvironment(
            store=config,
            registry=_FixedServices(env.registry, services),
            index=index,
            mesh=mesh,
            domain_suffix=env.domain_suffix,
            share_outputs=env.share_outputs,
        )
        scratch.jwks = jwks
        return scratch

    before_env = environment(
        _FrozenStore(snapshot), lambda: [s for _, services in by_registry for s in services], index_before
    )
    after_env = environment(store, services_after, updater.index)
    before = before_env.build_push_context("preview-before", keep_lasting=False)
    await slicer.pause()
    after = after_env.build_push_context("preview-after", keep_lasting=False)
    await slicer.pause()
    request = merge_all(requests) if requests else None
    cached = sources.server.cache is not None
    return Snapshots(
        before,
        after,
        before_env,
        after_env,
        index_before,
        updater.index,
        request,
        XdsCache() if cached else None,
        XdsCache() if cached else None,
    )
