"""Generators for proxyless gRPC clients (node metadata ``GENERATOR: grpc``), as istiod's grpcgen.

gRPC asks for listeners and clusters by name, even though those types are
wildcard for Envoy; the watched names are the filter. Endpoints come from
the sidecar EDS generator: a ClusterLoadAssignment is the same for both
kinds of client (locality weights are set, which gRPC needs).

These resources are not put in the XdsCache: their names overlap sidecar
resources of other shapes (``outbound|9080||reviews...`` is both a sidecar
cluster and a gRPC cluster and route), and proxyless clients are few. Each
push regenerates them from the snapshot, and the stream's digest skips
sending what did not change.
"""

from __future__ import annotations

from typing import Any

from meshpilot.model.kind import Kind
from meshpilot.model.peer_authentication import WorkloadMtls
from meshpilot.model.push_request import PushRequest
from meshpilot.networking import grpc_rbac
from meshpilot.networking.grpc_clusters import build_grpc_clusters
from meshpilot.networking.grpc_listeners import inbound_listeners, outbound_listeners, parse_listener_names
from meshpilot.networking.grpc_routes import build_grpc_route_configuration
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.generators.base import GenerationContext, Resource, ResourceList, only_kinds
from meshpilot.xds.generators.envoy_filters import report_proxyless
from meshpilot.xds.types import TypeUrl

#: Kinds that cannot change what each type holds for a gRPC client.
#: Server listeners carry the AuthorizationPolicies' RBAC filters (and report RequestAuthentications).
_NOT_LISTENERS = frozenset(
    {
        Kind.GATEWAY,
        Kind.WORKLOAD_ENTRY,
        Kind.WORKLOAD_GROUP,
        Kind.DESTINATION_RULE,
        Kind.VIRTUAL_SERVICE,
        Kind.TELEMETRY,
    }
)
_NOT_CLUSTERS = frozenset(
    {
        Kind.GATEWAY,
        Kind.WORKLOAD_ENTRY,
        Kind.WORKLOAD_GROUP,
        Kind.VIRTUAL_SERVICE,
        Kind.AUTHORIZATION_POLICY,
        Kind.REQUEST_AUTHENTICATION,
        Kind.PEER_AUTHENTICATION,
        Kind.TELEMETRY,
    }
)
_NOT_ROUTES = frozenset(
    {
        Kind.GATEWAY,
        Kind.WORKLOAD_ENTRY,
        Kind.WORKLOAD_GROUP,
        Kind.AUTHORIZATION_POLICY,
        Kind.REQUEST_AUTHENTICATION,
        Kind.PEER_AUTHENTICATION,
        Kind.TELEMETRY,
    }
)


def _wanted(watch: WatchedResource, names: frozenset[str] | None) -> frozenset[str]:
    return names if names is not None else watch.names


class GrpcListenerGenerator:
    """API listeners named as dialled, and xDS server listeners."""

    type_url = TypeUrl.LISTENER

    def needs_push(self, request: PushRequest) -> bool:
        return request.full and not only_kinds(request, _NOT_LISTENERS)

    def generate(
        self, ctx: GenerationContext, watch: WatchedResource, names: frozenset[str] | None
    ) -> list[Resource] | None:
        request = parse_listener_names(_wanted(watch, names), ctx.proxy)
        report_proxyless(ctx.proxy, ctx.push)
        built = outbound_listeners(ctx.proxy, request)
        if request.inbound:
            mtls = _workload_mtls(ctx)
            # Built per push from the snapshot, like every gRPC resource (no cache key to keep).
            rbac_filters = grpc_rbac.http_filters(grpc_rbac.inputs(ctx.proxy, ctx.push))
            built += inbound_listeners(ctx.proxy, request, mtls, rbac_filters)
        return ResourceList(Resource.of(li.name, li) for li in built)


def _workload_mtls(ctx: GenerationContext) -> WorkloadMtls:
    """The server's PeerAuthentication, looked up as istiod's grpcgen does (node namespace, labels)."""
    proxy = ctx.proxy
    namespace = proxy.metadata.namespace or proxy.config_namespace
    return ctx.push.peer_authentication.for_workload(namespace, proxy.labels)


class GrpcClusterGenerator:
    """EDS clusters and DestinationRule subset clusters, by name."""

    type_url = TypeUrl.CLUSTER

    def needs_push(self, request: PushRequest) -> bool:
        return request.full and not only_kinds(request, _NOT_CLUSTERS)

    def generate(
        self, ctx: GenerationContext, watch: WatchedResource, names: frozenset[str] | None
    ) -> list[Resource] | None:
        built = build_grpc_clusters(ctx.proxy, ctx.push, _wanted(watch, names))
        return ResourceList(Resource.of(c.name, c) for c in built)


class GrpcRouteGenerator:
    """One route configuration per ``outbound|PORT||FQDN`` name."""

    type_url = TypeUrl.ROUTE

    def needs_push(self, request: PushRequest) -> bool:
        return request.full and not only_kinds(request, _NOT_ROUTES)

    def generate(
        self, ctx: GenerationContext, watch: WatchedResource, names: frozenset[str] | None
    ) -> list[Resource] | None:
        out = []
        by_port: dict[int, Any] = {}
        for name in sorted(_wanted(watch, names)):
            config = build_grpc_route_configuration(ctx.proxy, ctx.push, name, by_port)
            if config is not None:
                out.append(Resource.of(name, config))
        return out
