"""CDS: clusters, rebuilt on full pushes whose changes can affect them.

Outbound clusters are cached one by one under a key of everything their
builder reads (service, DestinationRule, identities, MeshConfig, the proxy's
capabilities), and the whole outbound list is shared, per snapshot, by the
proxies with the same capabilities of every scope with the same imports
(``SidecarScope.import_signature``: usually every namespace without a Sidecar),
and kept from the previous snapshot while it holds the same clusters (``same_list``).
Inbound clusters are shared by the proxies that serve the same ports.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from meshpilot.model.kind import Kind
from meshpilot.model.proxy import NodeType, Proxy
from meshpilot.model.push_context import PushContext
from meshpilot.model.push_request import PushRequest
from meshpilot.networking.auto_passthrough import (
    serves_auto_passthrough,
    sni_dnat_cache_key,
    sni_dnat_cluster,
    sni_dnat_name,
    sni_dnat_specs,
)
from meshpilot.networking.cluster import (
    ClusterInputs,
    OutboundSpec,
    blackhole_cluster,
    build_outbound_cluster,
    other_clusters,
    outbound_specs,
)
from meshpilot.networking.cluster_wire import OutboundClusterEncoder
from meshpilot.networking.endpoint import proxy_signature
from meshpilot.networking.envoyfilter.patches import patch_set
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.dependencies import clusters_kept
from meshpilot.xds.generators.base import (
    GenerationContext,
    Resource,
    ResourceList,
    joined,
    only_kinds,
    same_list,
    shared_token,
)
from meshpilot.xds.generators.envoy_filters import has_cluster_patches, patch_clusters
from meshpilot.xds.types import TypeUrl

# Gateways are not skipped: an AUTO_PASSTHROUGH server adds a router's SNI-DNAT clusters (only routers
# are pushed for Gateways, and an unchanged list is not sent).
_SKIPPED = frozenset(
    {
        Kind.WORKLOAD_ENTRY,
        Kind.WORKLOAD_GROUP,
        Kind.AUTHORIZATION_POLICY,
        Kind.REQUEST_AUTHENTICATION,
        Kind.TELEMETRY,
    }
)


class ClusterGenerator:
    type_url = TypeUrl.CLUSTER

    def needs_push(self, request: PushRequest) -> bool:
        return request.full and not only_kinds(request, _SKIPPED)

    def kept_for(self, proxy: Proxy, request: PushRequest) -> bool:
        return clusters_kept(proxy, request)

    def generate(
        self, ctx: GenerationContext, watch: WatchedResource, names: frozenset[str] | None
    ) -> list[Resource] | None:
        proxy, push = ctx.proxy, ctx.push
        scope = proxy.sidecar_scope
        assert scope is not None
        # DNS clusters carry their endpoints, so their list also depends on the index.
        generation = ctx.index.generation if scope.has_dns else 0
        # DNS clusters' inline endpoints may be prioritized relative to the proxy's locality, but
        # only when the snapshot rewrites assignments by locality at all (the EDS memo's test).
        locality = proxy.locality.label if scope.has_dns and proxy_signature(proxy, push) else None
        outbound, seen = push.memoized(
            # All the outbound clusters read of a scope is what it imports (``outbound_specs``).
            (
                "cds-out",
                shared_token(push, scope, "cds-out", scope.import_signature),
                proxy.capabilities,
                generation,
                locality,
            ),
            lambda: self._outbound(ctx),
        )
        others_key = ("cds-in", proxy.capabilities, proxy.inbound_signature, scope.inbound_pool_key)
        if proxy.type is NodeType.ROUTER:
            # A gateway has no inbound side and nothing passes through it: BlackHoleCluster only.
            others: ResourceList = push.memoized_lasting(
                ("cds-gw",), lambda: _Others([Resource.of(*_blackhole(push))])
            )
            if serves_auto_passthrough(push.merged_gateway(proxy)):
                sni_dnat = push.memoized(
                    ("cds-sni-dnat", id(scope), proxy.capabilities, generation, locality),
                    lambda: self._sni_dnat(ctx),
                )
                others = joined(push, others, sni_dnat)
        elif scope.has_ingress:
            # Sidecar ingress endpoints come from the scope and may name the proxy's own address.
            others = push.memoized((others_key, id(scope), proxy.ip), lambda: self._others(ctx))
        else:
            # Without ingress listeners, these read only what the key names (and the mesh).
            others = push.memoized_lasting(others_key, lambda: self._others(ctx))
        patches = patch_set(proxy, push)
        if has_cluster_patches(patches):
            assert patches is not None
            return patch_clusters(proxy, push, outbound, others, patches)
        if seen.isdisjoint(others.names):
            # With Sidecar ingress the inbound part is the proxy's own (keyed by its address).
            if scope.has_ingress:
                return ResourceList.joined(outbound, others)
            return joined(push, outbound, others)
        return [*outbound, *(r for r in others if r.name not in seen)]

    def _outbound(self, ctx: GenerationContext) -> tuple[ResourceList, frozenset[str]]:
        """The outbound clusters, and their names (other clusters of the same name are dropped)."""
        inputs = ClusterInputs(ctx.proxy, ctx.push, ctx.index)
        encoder = OutboundClusterEncoder(inputs)
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
                payload = _outbound_payload(encoder, spec)
                if cache is not None:
                    cache.add(key, payload, spec.dependencies(), token)
            elif cache is not None and cache.verify:
                payload = cache.check(key, payload, _outbound_payload(encoder, spec))
            if payload:
                out.append(Resource(name, payload))
        # Made again for each snapshot: kept as the previous one's while the same (``joined``'s key).
        listed = same_list(ctx.push, ResourceList(out))
        return listed, listed.names

    def _sni_dnat(self, ctx: GenerationContext) -> ResourceList:
        """The SNI-DNAT clusters of an AUTO_PASSTHROUGH gateway, each cached as an outbound one is."""
        inputs = ClusterInputs(ctx.proxy, ctx.push, ctx.index)
        cache = ctx.cache.for_type(self.type_url) if ctx.cache is not None else None
        out: list[Resource] = []
        for spec in sni_dnat_specs(ctx.proxy):
            if cache is None:
                payload = _sni_dnat_payload(inputs, spec)
            else:
                key = sni_dnat_cache_key(spec, inputs)
                payload = cache.fetch(
                    key, partial(_sni_dnat_payload, inputs, spec), spec.dependencies, ctx.token
                )
            if payload:
                out.append(Resource(sni_dnat_name(spec), payload))
        return ResourceList(out)

    def _others(self, ctx: GenerationContext) -> _Others:
        inputs = ClusterInputs(ctx.proxy, ctx.push, ctx.index)
        return _Others(Resource.of(c.name, c) for c in other_clusters(inputs))


class _Others(ResourceList):
    """BlackHole, Passthrough and inbound clusters."""

    __slots__ = ()


def _blackhole(push: PushContext) -> tuple[str, Any]:
    cluster = blackhole_cluster(push.mesh)
    return cluster.name, cluster


def _sni_dnat_payload(inputs: ClusterInputs, spec: OutboundSpec) -> bytes:
    cluster = sni_dnat_cluster(inputs, spec)
    return Resource.of(cluster.name, cluster).payload if cluster is not None else b""


def _outbound_payload(encoder: OutboundClusterEncoder, spec: OutboundSpec) -> bytes:
    """One outbound cluster: from its class template, else built; b"" if it must not exist."""
    payload = encoder.encode(spec)
    if payload is not None:
        return payload
    cluster = build_outbound_cluster(encoder.inputs, spec.service, spec.port, spec.subset, spec.rule)
    # b"" stands for a cluster that must not exist (DNS without endpoints).
    return Resource.of(spec.name, cluster).payload if cluster is not None else b""
