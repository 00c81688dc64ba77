"""CDS: clusters, rebuilt on full pushes whose changes can affect them.

Outbound clusters are cached under a key of everything their builder reads
(service, DestinationRule, identities, MeshConfig, the proxy's capabilities),
so proxies that see a service alike share its encoding.
"""

from __future__ import annotations

from meshpilot.model.kind import Kind
from meshpilot.model.push_request import PushRequest
from meshpilot.networking.cluster import ClusterInputs, build_outbound_cluster, other_clusters, outbound_specs
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.generators.base import GenerationContext, Resource, only_kinds
from meshpilot.xds.types import TypeUrl

_SKIPPED = (
    Kind.GATEWAY,
    Kind.WORKLOAD_ENTRY,
    Kind.WORKLOAD_GROUP,
    Kind.AUTHORIZATION_POLICY,
    Kind.REQUEST_AUTHENTICATION,
)
#: Cached for a cluster that must not exist (DNS without endpoints).
_ABSENT = b""


class ClusterGenerator:
    type_url = TypeUrl.CLUSTER

    def needs_push(self, request: PushRequest) -> bool:
        return request.full and not only_kinds(request, _SKIPPED)

    def generate(
        self, ctx: GenerationContext, watch: WatchedResource, names: frozenset[str] | None
    ) -> list[Resource] | None:
        inputs = ClusterInputs(ctx.proxy, ctx.push, ctx.index)
        cache = ctx.cache.for_type(self.type_url) if ctx.cache is not None else None
        token = ctx.token
        out: list[Resource] = []
        seen: set[str] = set()
        for spec in outbound_specs(ctx.proxy):
            name = spec.name
            if name in seen:
                continue
            seen.add(name)
            key = spec.cache_key(inputs) if cache is not None else 0
            payload = cache.get(key) if cache is not None else None
            if payload is None:
                cluster = build_outbound_cluster(inputs, spec.service, spec.port, spec.subset, spec.rule)
                payload = Resource.of(name, cluster).payload if cluster is not None else _ABSENT
                if cache is not None:
                    cache.add(key, payload, spec.dependencies(), token)
            if payload:
                out.append(Resource(name, payload))
        for cluster in other_clusters(inputs):
            if cluster.name not in seen:
                seen.add(cluster.name)
                out.append(Resource.of(cluster.name, cluster))
        return out
