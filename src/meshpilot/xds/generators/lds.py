"""LDS: listeners, rebuilt on full pushes whose changes can affect them."""

from __future__ import annotations

import logging

from meshpilot.model.kind import Kind
from meshpilot.model.push_request import PushRequest
from meshpilot.networking.listener import build_outbound_listeners
from meshpilot.networking.listener_inbound import build_inbound_listeners
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.generators.base import GenerationContext, Resource, only_kinds
from meshpilot.xds.types import TypeUrl

log = logging.getLogger(__name__)

_SKIPPED = (Kind.GATEWAY, Kind.WORKLOAD_ENTRY, Kind.WORKLOAD_GROUP)


class ListenerGenerator:
    type_url = TypeUrl.LISTENER

    def needs_push(self, request: PushRequest) -> bool:
        return request.full and not only_kinds(request, _SKIPPED)

    def generate(
        self, ctx: GenerationContext, watch: WatchedResource, names: frozenset[str] | None
    ) -> list[Resource] | None:
        inbound = build_inbound_listeners(ctx.proxy, ctx.push)
        taken = {listener.name for listener in inbound}
        outbound = []
        for listener in build_outbound_listeners(ctx.proxy, ctx.push, ctx.index):
            # Envoy rejects a whole update with two listeners of one name; an
            # explicit Sidecar ingress port wins over an outbound service port.
            if listener.name in taken:
                log.warning(
                    "%s: outbound listener %s conflicts with an inbound listener; skipped",
                    ctx.proxy.id,
                    listener.name,
                )
                continue
            taken.add(listener.name)
            outbound.append(listener)
        return [Resource.of(listener.name, listener) for listener in [*outbound, *inbound]]
