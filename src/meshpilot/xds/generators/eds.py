"""EDS: ClusterLoadAssignments by cluster name, wire-encoded and cached.

On an endpoint-only push, only clusters of the hosts that changed are sent;
SotW allows a partial EDS response (unsent assignments stay as they are).
An assignment depends on the service, the subset and the DestinationRule's
TLS mode, which make its cache key, and on the endpoints, whose every
update evicts it, so proxies share one encoding per cluster.
"""

from __future__ import annotations

from meshpilot.model.kind import Kind
from meshpilot.model.push_request import PushRequest
from meshpilot.networking import wire
from meshpilot.networking.endpoint import cla_inputs, encode_from_inputs, proxy_signature
from meshpilot.networking.names import parse_cluster
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.generators.base import (
    GenerationContext,
    Resource,
    ResourceList,
    memoized_by_identity,
    only_kinds,
)
from meshpilot.xds.types import TypeUrl

_SKIPPED = frozenset(
    {
        Kind.GATEWAY,
        Kind.VIRTUAL_SERVICE,
        Kind.WORKLOAD_GROUP,
        Kind.AUTHORIZATION_POLICY,
        Kind.REQUEST_AUTHENTICATION,
        Kind.SECRET,
        Kind.TELEMETRY,
        # Patches change clusters, listeners and routes; a cluster an ADD brings is asked for by name.
        Kind.ENVOY_FILTER,
    }
)


def _names_by_host(names: frozenset[str]) -> dict[str, list[str]]:
    """Cluster names by service host: an endpoint push looks up only the hosts that changed."""
    out: dict[str, list[str]] = {}
    for name in names:
        parsed = parse_cluster(name)
        if parsed is not None:
            out.setdefault(parsed[3], []).append(name)
    return out


def _changed(request: PushRequest, by_host: dict[str, list[str]]) -> frozenset[str]:
    """The watched cluster names (``by_host``) of the hosts whose endpoints ``request`` changed."""
    hosts = {key.name for key in request.configs_updated if key.kind is Kind.SERVICE_ENTRY}
    return frozenset(n for host in hosts for n in by_host.get(host, ()))


class EndpointGenerator:
    type_url = TypeUrl.ENDPOINT

    def needs_push(self, request: PushRequest) -> bool:
        return not only_kinds(request, _SKIPPED)

    def generate(
        self, ctx: GenerationContext, watch: WatchedResource, names: frozenset[str] | None
    ) -> list[Resource] | None:
        wanted = names if names is not None else watch.names
        request = ctx.request
        if names is None and not request.full:
            # Watched name sets are shared objects (see shared_names), so this is one lookup.
            by_host = ctx.push.memoized(("eds-by-host", wanted), lambda: _names_by_host(wanted))
            # The proxies that watch the same names want the same of them: one set per request.
            wanted = memoized_by_identity(
                request.memoized, ("eds-wanted", id(by_host)), (by_host,), lambda: _changed(request, by_host)
            )
            if not wanted:
                return None
        scope = ctx.proxy.sidecar_scope
        # Locality load balancing makes assignments differ by the proxy's locality and labels.
        signature = proxy_signature(ctx.proxy, ctx.push)
        key = ("eds", id(scope), ctx.proxy.config_namespace, signature, wanted, ctx.index.generation)
        return ctx.push.memoized(key, lambda: self._assignments(ctx, wanted))

    def _assignments(self, ctx: GenerationContext, wanted: frozenset[str]) -> ResourceList:
        cache = ctx.cache.for_type(self.type_url) if ctx.cache is not None else None
        token = ctx.token
        # A ResourceList: the proxies that share it share its name set too (the push history's).
        out = ResourceList()
        for name in sorted(wanted):
            inputs = cla_inputs(name, ctx.proxy, ctx.push)
            if inputs is None or cache is None:
                payload = wire.any_bytes(self.type_url, encode_from_inputs(name, inputs, ctx.index))
            else:
                key = inputs.cache_key(name)
                cached = cache.get(key)
                if cached is None:
                    payload = wire.any_bytes(self.type_url, encode_from_inputs(name, inputs, ctx.index))
                    cache.add(key, payload, inputs.dependencies(), token)
                elif cache.verify:
                    fresh = wire.any_bytes(self.type_url, encode_from_inputs(name, inputs, ctx.index))
                    payload = cache.check(key, cached, fresh)
                else:
                    payload = cached
            out.append(Resource(name, payload))
        return out
