"""LDS: listeners, rebuilt on full pushes whose changes can affect them."""

from __future__ import annotations

from meshpilot.model.kind import Kind
from meshpilot.model.push_request import PushRequest
from meshpilot.networking.listener import build_outbound_listeners
from meshpilot.networking.listener_inbound import build_inbound_listeners
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.generators.base import GenerationContext, Resource, only_kinds
from meshpilot.xds.types import TypeUrl

_SKIPPED = (Kind.GATEWAY, Kind.WORKLOAD_ENTRY, Kind.WORKLOAD_GROUP)


class ListenerGenerator:
    type_url = TypeUrl.LISTENER

    def needs_push(self, request: PushRequest) -> bool:
        return request.full and not only_kinds(request, _SKIPPED)

    def generate(
        self, ctx: GenerationContext, watch: WatchedResource, names: frozenset[str] | None
    ) -> list[Resource] | None:
        listeners = build_outbound_listeners(ctx.proxy, ctx.push, ctx.index)
        listeners += build_inbound_listeners(ctx.proxy, ctx.push)
        return [Resource(listener.name, listener) for listener in listeners]
