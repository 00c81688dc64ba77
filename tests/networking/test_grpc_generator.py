"""Proxyless gRPC resources (istiod's grpcgen shapes): listeners, routes, clusters, and the lookup."""

from __future__ import annotations

from typing import Any

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.http.fault.v3 import fault_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2
from support.kube import istio, workload
from support.mesh_objects import mesh_objects
from support.model import Model, build

from meshpilot.model.config import ConfigKey
from meshpilot.model.kind import Kind
from meshpilot.model.proxy import Proxy
from meshpilot.model.push_request import PushRequest
from meshpilot.networking.grpc_listeners import fqdn_for, parse_listener_names
from meshpilot.server.metrics import Metrics
from meshpilot.xds.cache import XdsCache
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.generators import sidecar_generators
from meshpilot.xds.generators.base import GenerationContext
from meshpilot.xds.generators.eds import EndpointGenerator
from meshpilot.xds.generators.grpc import GrpcClusterGenerator, GrpcListenerGenerator, GrpcRouteGenerator
from meshpilot.xds.server import DiscoveryServer
from meshpilot.xds.types import TypeUrl

GRPC_CLIENT = "sidecar~10.1.0.99~grpc-client.default~default.svc.cluster.local"
REVIEWS_FQDN = "reviews.default.svc.cluster.local"
REVIEWS = f"outbound|9080||{REVIEWS_FQDN}"
REVIEWS_V1 = f"outbound|9080|v1|{REVIEWS_FQDN}"
REVIEWS_V2 = f"outbound|9080|v2|{REVIEWS_FQDN}"
INBOUND = "xds.istio.io/grpc/lds/inbound/0.0.0.0:9080"


def grpc_proxy(model: Model, node: str = GRPC_CLIENT) -> Proxy:
    return model.proxy(node, {"GENERATOR": "grpc"})


def generate(model: Model, generator: Any, names: set[str], proxy: Proxy | None = None) -> dict[str, Any]:
    """Generated resources by name, parsed into their messages."""
    proxy = proxy or grpc_proxy(model)
    ctx = GenerationContext(proxy, model.push, model.index, PushRequest(push=model.push))
    watch = WatchedResource(generator.type_url, names=frozenset(names))
    message_type = {
        TypeUrl.LISTENER: listener_pb2.Listener,
        TypeUrl.CLUSTER: cluster_pb2.Cluster,
        TypeUrl.ROUTE: route_pb2.RouteConfiguration,
        TypeUrl.ENDPOINT: endpoint_pb2.ClusterLoadAssignment,
    }[generator.type_url]
    out = {}
    for resource in generator.generate(ctx, watch, None) or []:
        message = message_type()
        assert resource.message().Unpack(message)
        out[resource.name] = message
    return out


def listeners(model: Model, *names: str, proxy: Proxy | None = None) -> dict[str, Any]:
    return generate(model, GrpcListenerGenerator(), set(names), proxy)


def clusters(model: Model, *names: str) -> dict[str, Any]:
    return generate(model, GrpcClusterGenerator(), set(names))


def routes(model: Model, *names: str) -> dict[str, Any]:
    return generate(model, GrpcRouteGenerator(), set(names))


def hcm_of(listener: Any) -> Any:
    hcm = hcm_pb2.HttpConnectionManager()
    assert listener.api_listener.api_listener.Unpack(hcm)
    return hcm


# -- LDS ---------------------------------------------------------------------------


def test_an_api_listener_is_named_as_dialled_and_names_its_route(model: Model) -> None:
    found = listeners(model, f"{REVIEWS_FQDN}:9080")
    assert list(found) == [f"{REVIEWS_FQDN}:9080"]
    listener = found[f"{REVIEWS_FQDN}:9080"]
    assert listener.address.socket_address.address == "10.96.0.20"
    assert listener.address.socket_address.port_value == 9080
    assert not listener.filter_chains and not listener.listener_filters
    assert not listener.HasField("use_original_dst")
    hcm = hcm_of(listener)
    assert hcm.rds.route_config_name == REVIEWS
    assert hcm.rds.config_source.WhichOneof("config_source_specifier") == "ads"
    assert [f.name for f in hcm.http_filters] == ["envoy.filters.http.fault", "envoy.filters.http.router"]
    assert hcm.http_filters[0].typed_config.Is(fault_pb2.HTTPFault.DESCRIPTOR)
    assert hcm.http_filters[1].typed_config.Is(router_pb2.Router.DESCRIPTOR)


def test_short_names_resolve_in_the_clients_namespace() -> None:
    proxy = build(mesh_objects()).proxy(GRPC_CLIENT, {"GENERATOR": "grpc"})
    assert fqdn_for("reviews", proxy) == REVIEWS_FQDN
    assert fqdn_for("reviews.default", proxy) == REVIEWS_FQDN
    assert fqdn_for("reviews.default.svc", proxy) == REVIEWS_FQDN
    # Another namespace's short form is not expanded (istiod's tryFindFQDN).
    assert fqdn_for("ratings.other", proxy) == ""
    assert fqdn_for(REVIEWS_FQDN, proxy) == ""


def test_each_requested_name_gets_its_own_listener(model: Model) -> None:
    found = listeners(model, "reviews:9080", "reviews.default:9080", f"{REVIEWS_FQDN}:9080")
    assert sorted(found) == sorted(["reviews:9080", "reviews.default:9080", f"{REVIEWS_FQDN}:9080"])
    assert {hcm_of(li).rds.route_config_name for li in found.values()} == {REVIEWS}


def test_a_name_without_port_asks_for_every_port() -> None:
    docs = [
        *mesh_objects(),
        *workload("multi", "default", "10.96.0.60", 8080, {"multi-0": "10.1.0.61"}, port_name="grpc"),
    ]
    docs[-3]["spec"]["ports"].append({"name": "grpc-admin", "port": 8081, "targetPort": 8081})
    model = build(docs)
    assert sorted(listeners(model, "multi")) == ["multi:8080", "multi:8081"]
    assert sorted(listeners(model, "multi:8081")) == ["multi:8081"]
    request = parse_listener_names(["multi:8081", "multi"], grpc_proxy(model))
    assert request.hosts["multi"].ports == set()


def test_unknown_names_get_nothing_and_no_names_get_everything(model: Model) -> None:
    assert listeners(model, "nosuch:9080", "reviews:1234", "ratings.other:9080") == {}
    everything = listeners(model)
    assert f"{REVIEWS_FQDN}:9080" in everything
    assert "ratings.other.svc.cluster.local:9080" in everything
    assert "db.default.svc.cluster.local:3306" in everything


def test_an_xds_server_gets_a_plaintext_inbound_listener() -> None:
    model = build(mesh_objects())
    server = model.proxy(
        "sidecar~10.1.0.21~reviews-v1.default~default.svc.cluster.local", {"GENERATOR": "grpc"}
    )
    found = listeners(model, INBOUND, "xds.istio.io/grpc/lds/inbound/0.0.0.0:7777", proxy=server)
    assert list(found) == [INBOUND]
    listener = found[INBOUND]
    assert listener.address.socket_address.address == "0.0.0.0"
    assert listener.address.socket_address.port_value == 9080
    assert not listener.listener_filters and not listener.HasField("use_original_dst")
    [chain] = listener.filter_chains
    assert chain.name == "inbound-plaintext"
    assert not chain.HasField("transport_socket")
    [network_filter] = chain.filters
    assert network_filter.name == "inbound-hcmplaintext"
    hcm = hcm_pb2.HttpConnectionManager()
    assert network_filter.typed_config.Unpack(hcm)
    assert [f.name for f in hcm.http_filters] == ["envoy.filters.http.router"]
    assert hcm.route_config.name == "inbound"
    [vhost] = hcm.route_config.virtual_hosts
    assert list(vhost.domains) == ["*"]
    [route] = vhost.routes
    assert route.match.prefix == "/"
    assert route.WhichOneof("action") == "non_forwarding_action"


def test_an_mtls_workload_gets_a_strict_inbound_listener() -> None:
    docs = [
        *workload(
            "secure",
            "default",
            "10.96.0.70",
            9090,
            {"secure-0": "10.1.0.71"},
            labels={"security.istio.io/tlsMode": "istio"},
            port_name="grpc",
        )
    ]
    model = build(docs)
    server = model.proxy(
        "sidecar~10.1.0.71~secure-0.default~default.svc.cluster.local", {"GENERATOR": "grpc"}
    )
    name = "xds.istio.io/grpc/lds/inbound/[::]:9090"
    [chain] = listeners(model, name, proxy=server)[name].filter_chains
    assert chain.name == "inbound-mtls"
    assert chain.transport_socket.name == "envoy.transport_sockets.tls"
    context = tls_pb2.DownstreamTlsContext()
    assert chain.transport_socket.typed_config.Unpack(context)
    assert context.require_client_certificate.value is True
    common = context.common_tls_context
    assert common.tls_certificate_certificate_provider_instance.instance_name == "default"
    assert common.tls_certificate_certificate_provider_instance.certificate_name == "default"
    roots = common.combined_validation_context.validation_context_certificate_provider_instance
    assert (roots.instance_name, roots.certificate_name) == ("default", "ROOTCA")


@pytest.mark.parametrize(
    "name",
    [
        "xds.istio.io/grpc/lds/inbound/",
        "xds.istio.io/grpc/lds/inbound/0.0.0.0",
        "xds.istio.io/grpc/lds/inbound/0.0.0.0:http",
        "xds.istio.io/grpc/lds/inbound/[::1:9080",
        "::::",
        "",
    ],
)
def test_malformed_listener_names_are_skipped(model: Model, name: str) -> None:
    assert name not in listeners(model, name, "reviews:9080")


# -- RDS ---------------------------------------------------------------------------


def test_a_route_configuration_holds_one_service_with_ported_domains(model: Model) -> None:
    config = routes(model, REVIEWS)[REVIEWS]
    assert config.name == REVIEWS
    # gRPC reads only the virtual hosts; none of a sidecar's header fields are set.
    assert not config.HasField("validate_clusters") and not config.ignore_port_in_host_matching
    [vhost] = config.virtual_hosts
    assert vhost.name == f"{REVIEWS_FQDN}:9080"
    assert list(vhost.domains) == [
        REVIEWS_FQDN,
        f"{REVIEWS_FQDN}:9080",
        f"{REVIEWS_FQDN}.",
        f"{REVIEWS_FQDN}.:9080",
        "reviews",
        "reviews:9080",
        "reviews.default.svc",
        "reviews.default.svc:9080",
        "reviews.default",
        "reviews.default:9080",
        "10.96.0.20",
        "10.96.0.20:9080",
    ]
    [route] = vhost.routes
    assert route.name == "default"
    assert route.route.cluster == REVIEWS
    # The default route is built without the proxy in istiod too: max_grpc_timeout stays.
    assert route.route.HasField("max_grpc_timeout")
    assert not route.route.HasField("max_stream_duration")


def test_virtual_service_routes_keep_matches_weights_and_subsets() -> None:
    vs = istio(
        "VirtualService",
        "reviews",
        "default",
        {
            "hosts": ["reviews"],
            "http": [
                {
                    "match": [{"headers": {"end-user": {"exact": "jason"}}}],
                    "timeout": "3s",
                    "route": [{"destination": {"host": "reviews", "subset": "v2"}}],
                },
                {
                    "fault": {"abort": {"httpStatus": 503, "percentage": {"value": 1}}},
                    "corsPolicy": {"allowOrigins": [{"exact": "https://example.com"}]},
                    "route": [
                        {"destination": {"host": "reviews", "subset": "v1"}, "weight": 75},
                        {"destination": {"host": "reviews", "subset": "v2"}, "weight": 25},
                    ],
                },
            ],
        },
    )
    model = build([*mesh_objects(), vs])
    [vhost] = routes(model, REVIEWS)[REVIEWS].virtual_hosts
    jason, weighted = vhost.routes
    [header] = jason.match.headers
    assert (header.name, header.string_match.exact) == ("end-user", "jason")
    assert jason.route.cluster == REVIEWS_V2
    # Proxyless gRPC reads the timeout from max_stream_duration (istiod's setTimeout).
    assert jason.route.max_stream_duration.max_stream_duration.seconds == 3
    assert not jason.route.HasField("max_grpc_timeout")
    assert [(c.name, c.weight.value) for c in weighted.route.weighted_clusters.clusters] == [
        (REVIEWS_V1, 75),
        (REVIEWS_V2, 25),
    ]
    # gRPC has the fault filter but no CORS filter, and rejects a route config naming one.
    assert list(weighted.typed_per_filter_config) == ["envoy.filters.http.fault"]


def test_other_services_on_the_port_are_left_out(model: Model) -> None:
    ratings = "outbound|9080||ratings.other.svc.cluster.local"
    found = routes(model, REVIEWS, ratings)
    assert [v.name for v in found[REVIEWS].virtual_hosts] == [f"{REVIEWS_FQDN}:9080"]
    assert [v.name for v in found[ratings].virtual_hosts] == ["ratings.other.svc.cluster.local:9080"]


def test_route_names_that_name_no_cluster_are_not_answered(model: Model) -> None:
    # istiod parses route names as cluster names; "9080" or "host:port" are not served.
    assert routes(model, "9080", f"{REVIEWS_FQDN}:9080", "outbound|x||reviews", "outbound|9080||") == {}
    unknown = "outbound|9080||nosuch.default.svc.cluster.local"
    assert list(routes(model, unknown)[unknown].virtual_hosts) == []


# -- CDS ---------------------------------------------------------------------------


def test_clusters_are_plain_eds_clusters_by_name(model: Model) -> None:
    found = clusters(model, REVIEWS)
    assert list(found) == [REVIEWS]
    cluster = found[REVIEWS]
    assert cluster.type == cluster_pb2.Cluster.EDS
    assert cluster.eds_cluster_config.service_name == REVIEWS
    assert cluster.eds_cluster_config.eds_config.WhichOneof("config_source_specifier") == "ads"
    assert cluster.alt_stat_name == REVIEWS + ";"
    # ROUND_ROBIN (the default) and no TLS: auto mTLS is not applied to gRPC clients.
    assert cluster.lb_policy == cluster_pb2.Cluster.ROUND_ROBIN
    assert not cluster.HasField("transport_socket") and not cluster.transport_socket_matches
    assert not cluster.HasField("circuit_breakers") and not cluster.HasField("connect_timeout")


def test_subset_clusters_only_when_asked_for(model: Model) -> None:
    assert list(clusters(model, REVIEWS_V1)) == [REVIEWS_V1]
    assert sorted(clusters(model, REVIEWS, REVIEWS_V2)) == sorted([REVIEWS, REVIEWS_V2])
    # A subset the DestinationRule does not define is not built.
    assert clusters(model, f"outbound|9080|v9|{REVIEWS_FQDN}") == {}


def test_destination_rule_policies_gRPC_can_use() -> None:
    rule = istio(
        "DestinationRule",
        "reviews",
        "default",
        {
            "host": "reviews",
            "trafficPolicy": {"loadBalancer": {"consistentHash": {"httpHeaderName": "x-user"}}},
            "subsets": [
                {
                    "name": "v1",
                    "labels": {"version": "v1"},
                    "trafficPolicy": {"tls": {"mode": "ISTIO_MUTUAL"}},
                }
            ],
        },
    )
    docs = [d for d in mesh_objects() if d.get("kind") != "DestinationRule"] + [rule]
    model = build(docs)
    found = clusters(model, REVIEWS, REVIEWS_V1)
    assert found[REVIEWS].lb_policy == cluster_pb2.Cluster.RING_HASH
    assert found[REVIEWS].ring_hash_lb_config.minimum_ring_size.value == 1024
    assert not found[REVIEWS].HasField("transport_socket")
    v1 = found[REVIEWS_V1]
    assert v1.lb_policy == cluster_pb2.Cluster.RING_HASH
    assert v1.transport_socket.name == "envoy.transport_sockets.tls"
    context = tls_pb2.UpstreamTlsContext()
    assert v1.transport_socket.typed_config.Unpack(context)
    common = context.common_tls_context
    assert common.tls_certificate_certificate_provider_instance.certificate_name == "default"
    validation = common.combined_validation_context
    assert validation.validation_context_certificate_provider_instance.certificate_name == "ROOTCA"
    assert [m.exact for m in validation.default_validation_context.match_subject_alt_names] == [
        "spiffe://cluster.local/ns/default/sa/reviews"
    ]


def test_unknown_services_get_a_bare_cluster_and_bad_names_nothing(model: Model) -> None:
    unknown = "outbound|9080||nosuch.default.svc.cluster.local"
    assert list(clusters(model, unknown, "nonsense", "outbound|0||x", "inbound|9080||")) == [unknown]


# -- EDS and the lookup --------------------------------------------------------------


def test_subset_endpoints_are_filtered_by_labels(model: Model) -> None:
    found = generate(model, EndpointGenerator(), {REVIEWS, REVIEWS_V1})

    def addresses(cla: Any) -> list[str]:
        return [e.endpoint.address.socket_address.address for g in cla.endpoints for e in g.lb_endpoints]

    assert addresses(found[REVIEWS]) == ["10.1.0.21", "10.1.0.22"]
    assert addresses(found[REVIEWS_V1]) == ["10.1.0.21"]
    # gRPC ignores a locality without a weight.
    assert all(g.load_balancing_weight.value > 0 for g in found[REVIEWS].endpoints)


def test_the_generator_metadata_chooses_the_generators(model: Model) -> None:
    server = DiscoveryServer(model.env, Metrics())
    grpc_set = server.generators_for(grpc_proxy(model))
    sidecar_set = server.generators_for(
        model.proxy("sidecar~10.1.0.11~productpage-v1.default~default.svc.cluster.local")
    )
    assert isinstance(grpc_set[TypeUrl.LISTENER], GrpcListenerGenerator)
    assert isinstance(grpc_set[TypeUrl.CLUSTER], GrpcClusterGenerator)
    assert isinstance(grpc_set[TypeUrl.ROUTE], GrpcRouteGenerator)
    assert isinstance(grpc_set[TypeUrl.ENDPOINT], EndpointGenerator)
    assert {t: type(g) for t, g in sidecar_set.items()} == {
        t: type(g) for t, g in sidecar_generators().items()
    }


def test_sidecar_and_grpc_resources_of_one_name_stay_apart_with_the_cache(model: Model) -> None:
    cache = XdsCache(100, Metrics())
    sidecar = model.proxy("sidecar~10.1.0.11~productpage-v1.default~default.svc.cluster.local")
    client = grpc_proxy(model)

    def cluster_for(proxy: Proxy, generator: Any) -> Any:
        ctx = GenerationContext(proxy, model.push, model.index, PushRequest(push=model.push), cache)
        watch = WatchedResource(TypeUrl.CLUSTER, names=frozenset({REVIEWS}))
        for resource in generator.generate(ctx, watch, None) or []:
            if resource.name == REVIEWS:
                message = cluster_pb2.Cluster()
                assert resource.message().Unpack(message)
                return message
        raise AssertionError("no reviews cluster")

    sidecar_generator = sidecar_generators()[TypeUrl.CLUSTER]
    for _ in range(2):  # the second round reads whatever the first one cached
        assert cluster_for(sidecar, sidecar_generator).transport_socket_matches  # auto mTLS
        grpc_cluster = cluster_for(client, GrpcClusterGenerator())
        assert not grpc_cluster.transport_socket_matches
        assert grpc_cluster.lb_policy == cluster_pb2.Cluster.ROUND_ROBIN
        assert not grpc_cluster.HasField("circuit_breakers")


def test_which_changes_push_which_grpc_types() -> None:
    def change(kind: Kind) -> PushRequest:
        return PushRequest(full=True, configs_updated=frozenset({ConfigKey(kind, "x", "default")}))

    lds, cds, rds = GrpcListenerGenerator(), GrpcClusterGenerator(), GrpcRouteGenerator()
    virtual_service = change(Kind.VIRTUAL_SERVICE)
    assert rds.needs_push(virtual_service)
    assert not lds.needs_push(virtual_service) and not cds.needs_push(virtual_service)
    rule = change(Kind.DESTINATION_RULE)
    assert cds.needs_push(rule) and rds.needs_push(rule) and not lds.needs_push(rule)
    service = change(Kind.SERVICE_ENTRY)
    assert lds.needs_push(service) and cds.needs_push(service) and rds.needs_push(service)
    assert not lds.needs_push(PushRequest(full=False))
