"""EDS: ClusterLoadAssignments by cluster name.

On an endpoint-only push, only clusters of the hosts that changed are sent;
SotW allows a partial EDS response (unsent assignments stay as they are).
"""

from __future__ import annotations

from meshpilot.model.kind import Kind
from meshpilot.model.push_request import PushRequest
from meshpilot.networking import wire
from meshpilot.networking.endpoint import encode_cluster_load_assignment
from meshpilot.networking.names import parse_cluster
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.generators.base import GenerationContext, Resource, only_kinds
from meshpilot.xds.types import TypeUrl

_SKIPPED = (
    Kind.GATEWAY,
    Kind.VIRTUAL_SERVICE,
    Kind.WORKLOAD_GROUP,
    Kind.AUTHORIZATION_POLICY,
    Kind.REQUEST_AUTHENTICATION,
)


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
            hosts = {key.name for key in request.configs_updated if key.kind is Kind.SERVICE_ENTRY}
            wanted = frozenset(
                n for n in wanted if (parsed := parse_cluster(n)) is not None and parsed[3] in hosts
            )
            if not wanted:
                return None
        return [
            Resource(
                name,
                wire.any_bytes(
                    self.type_url, encode_cluster_load_assignment(name, ctx.proxy, ctx.push, ctx.index)
                ),
            )
            for name in sorted(wanted)
        ]
