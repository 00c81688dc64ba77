"""CDS: clusters, rebuilt on full pushes whose changes can affect them."""

from __future__ import annotations

from meshpilot.model.kind import Kind
from meshpilot.model.push_request import PushRequest
from meshpilot.networking.cluster import ClusterInputs, build_clusters
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


class ClusterGenerator:
    type_url = TypeUrl.CLUSTER

    def needs_push(self, request: PushRequest) -> bool:
        return request.full and not only_kinds(request, _SKIPPED)

    def generate(
        self, ctx: GenerationContext, watch: WatchedResource, names: frozenset[str] | None
    ) -> list[Resource] | None:
        clusters = build_clusters(ClusterInputs(ctx.proxy, ctx.push, ctx.index))
        return [Resource.of(c.name, c) for c in clusters]
