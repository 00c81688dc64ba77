"""RDS: route configurations by name, rebuilt on full pushes whose changes can affect them."""

from __future__ import annotations

from meshpilot.model.kind import Kind
from meshpilot.model.push_request import PushRequest
from meshpilot.networking.route import build_route_configuration
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.generators.base import GenerationContext, Resource, only_kinds
from meshpilot.xds.types import TypeUrl

_SKIPPED = (
    Kind.WORKLOAD_ENTRY,
    Kind.WORKLOAD_GROUP,
    Kind.AUTHORIZATION_POLICY,
    Kind.REQUEST_AUTHENTICATION,
    Kind.PEER_AUTHENTICATION,
)


class RouteGenerator:
    type_url = TypeUrl.ROUTE

    def needs_push(self, request: PushRequest) -> bool:
        return request.full and not only_kinds(request, _SKIPPED)

    def generate(
        self, ctx: GenerationContext, watch: WatchedResource, names: frozenset[str] | None
    ) -> list[Resource] | None:
        wanted = names if names is not None else watch.names
        return [
            Resource.of(name, build_route_configuration(ctx.proxy, ctx.push, name)) for name in sorted(wanted)
        ]
