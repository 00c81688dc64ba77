"""RDS: route configurations by name, rebuilt on full pushes whose changes can affect them.

A route configuration is cached under its name, what the proxy's scope
holds for that port (services, VirtualServices, policy), the proxy's DNS
domain (short names), and the proxy's labels only when a VirtualService
matches on them.
"""

from __future__ import annotations

from functools import partial

from meshpilot.model.kind import Kind
from meshpilot.model.proxy import NodeType
from meshpilot.model.push_context import PushContext
from meshpilot.model.push_request import PushRequest
from meshpilot.model.sidecar_scope import SidecarScope
from meshpilot.networking import wire
from meshpilot.networking.envoyfilter.patches import patch_set
from meshpilot.networking.gateway import gateway_route_configuration, service_port_map
from meshpilot.networking.protobuf import serialize
from meshpilot.networking.route import (
    RouteCacheParts,
    encode_route_configuration,
    route_cache_key,
    route_cache_parts,
    route_parts_signature,
)
from meshpilot.xds.cache import TypedCache
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.generators.base import GenerationContext, Resource, only_kinds, shared_token
from meshpilot.xds.generators.envoy_filters import has_route_patches, patch_route_resources
from meshpilot.xds.types import TypeUrl

_SKIPPED = frozenset(
    {
        Kind.WORKLOAD_ENTRY,
        Kind.WORKLOAD_GROUP,
        Kind.AUTHORIZATION_POLICY,
        Kind.REQUEST_AUTHENTICATION,
        Kind.PEER_AUTHENTICATION,
        Kind.TELEMETRY,
    }
)


class RouteGenerator:
    type_url = TypeUrl.ROUTE

    def needs_push(self, request: PushRequest) -> bool:
        return request.full and not only_kinds(request, _SKIPPED)

    def generate(
        self, ctx: GenerationContext, watch: WatchedResource, names: frozenset[str] | None
    ) -> list[Resource] | None:
        generated = self._generate(ctx, names if names is not None else watch.names)
        patches = patch_set(ctx.proxy, ctx.push)
        if has_route_patches(patches):
            assert patches is not None
            return patch_route_resources(ctx.proxy, ctx.push, generated, patches)
        return generated

    def _generate(self, ctx: GenerationContext, wanted: frozenset[str]) -> list[Resource]:
        if ctx.proxy.type is NodeType.ROUTER:
            return [self._gateway(ctx, name) for name in sorted(wanted)]
        cache = ctx.cache.for_type(self.type_url) if ctx.cache is not None else None
        scope = ctx.proxy.sidecar_scope
        token = ctx.token
        out = []
        for name in sorted(wanted):
            parts = None
            if cache is not None and scope is not None:
                parts = _cache_parts(ctx.push, scope, name)
            if cache is None or parts is None:
                out.append(Resource(name, _any(encode_route_configuration(ctx.proxy, ctx.push, name))))
                continue
            key = route_cache_key(ctx.proxy, ctx.push, name, parts)
            # The Resource itself is shared by the proxies with this key, so its delta version and
            # envelope are computed once, not per proxy.
            out.append(
                ctx.push.memoized(("rds", key), partial(self._resource, ctx, name, key, parts, cache, token))
            )
        return out

    def _resource(
        self,
        ctx: GenerationContext,
        name: str,
        key: int,
        parts: RouteCacheParts,
        cache: TypedCache,
        token: int,
    ) -> Resource:
        return Resource(name, self._payload(ctx, name, key, parts, cache, token))

    def _payload(
        self,
        ctx: GenerationContext,
        name: str,
        key: int,
        parts: RouteCacheParts,
        cache: TypedCache,
        token: int,
    ) -> bytes:
        payload = cache.get(key)
        if payload is None:
            payload = _any(encode_route_configuration(ctx.proxy, ctx.push, name))
            cache.add(key, payload, parts.dependencies, token)
        elif cache.verify:
            payload = cache.check(key, payload, _any(encode_route_configuration(ctx.proxy, ctx.push, name)))
        return payload

    def _gateway(self, ctx: GenerationContext, name: str) -> Resource:
        proxy, push = ctx.proxy, ctx.push
        # Routes read the router's Gateways, its namespace (VirtualService visibility), for
        # sourceLabels matches its labels (which also select the Gateways), and the Service ports that
        # map the route's listen port back to Gateway ports.
        key = (
            "rds-gw",
            name,
            proxy.config_namespace,
            frozenset(proxy.labels.items()),
            proxy.capabilities,
            service_port_map(proxy),
        )
        payload = push.memoized(key, lambda: _any(serialize(gateway_route_configuration(proxy, push, name))))
        return Resource(name, payload)


def _cache_parts(push: PushContext, scope: SidecarScope, name: str) -> RouteCacheParts | None:
    """``route_cache_parts``, worked out once per route name for the scopes that read the same
    (``route_parts_signature``): usually every namespace without a Sidecar, each of which would
    otherwise walk the same thousand services on every full push."""
    held = ("route", name)
    if held in scope.memo:
        return scope.memo[held]  # type: ignore[return-value]
    token = shared_token(push, scope, "route-parts", partial(route_parts_signature, scope))
    parts: RouteCacheParts | None = push.memoized(
        ("route-parts", token, name), lambda: route_cache_parts(scope, name, push.domain_suffix)
    )
    scope.memo[held] = parts
    return parts


def _any(route_configuration: bytes) -> bytes:
    return wire.any_bytes(TypeUrl.ROUTE, route_configuration)
