"""CDS for a sidecar: istiod's names, types and shapes."""

from __future__ import annotations

from typing import Any

from envoy.config.cluster.v3 import cluster_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2 as hpo
from google.protobuf import json_format
from support.kube import istio, workload
from support.mesh_objects import CLIENT, mesh_objects
from support.model import Model, build

from meshpilot.networking.cluster import ClusterInputs, build_clusters


def clusters(model: Model, extensions: tuple[str, ...] = (), **meta: Any) -> dict[str, Any]:
    proxy = model.proxy(CLIENT, meta, extensions)
    return {c.name: c for c in build_clusters(ClusterInputs(proxy, model.push, model.index))}


def test_cluster_names_and_order(model: Model) -> None:
    names = list(clusters(model))
    assert names[-4:] == [
        "BlackHoleCluster",
        "PassthroughCluster",
        "inbound|9080||",
        "InboundPassthroughCluster",
    ]
    for required in (
        "BlackHoleCluster",
        "PassthroughCluster",
        "outbound|9080|v2|reviews.default.svc.cluster.local",
        "outbound|9080||ratings.other.svc.cluster.local",
        "outbound|3306||db.default.svc.cluster.local",
        "outbound|5000||headless.default.svc.cluster.local",
        "outbound|443||api.example.com",
    ):
        assert required in names
    index = names.index("outbound|9080||reviews.default.svc.cluster.local")
    assert names[index + 1 : index + 3] == [
        "outbound|9080|v1|reviews.default.svc.cluster.local",
        "outbound|9080|v2|reviews.default.svc.cluster.local",
    ]


def test_eds_cluster_shape(model: Model) -> None:
    c = clusters(model)["outbound|9080||ratings.other.svc.cluster.local"]
    assert c.type == cluster_pb2.Cluster.EDS
    assert c.eds_cluster_config.service_name == c.name
    assert c.eds_cluster_config.eds_config.HasField("ads")
    assert c.eds_cluster_config.eds_config.initial_fetch_timeout.ToSeconds() == 0
    assert c.connect_timeout.seconds == 10
    assert c.lb_policy == cluster_pb2.Cluster.LEAST_REQUEST
    assert c.alt_stat_name == c.name + ";"
    assert c.circuit_breakers.thresholds[0].max_connections.value == 0xFFFFFFFF
    assert c.HasField("common_lb_config")
    meta = json_format.MessageToDict(c.metadata)
    assert meta["filterMetadata"]["istio"]["services"] == [
        {"host": "ratings.other.svc.cluster.local", "name": "ratings", "namespace": "other"}
    ]
    assert not c.typed_extension_protocol_options, "plain HTTP ports get Envoy's defaults"


def test_auto_mtls_matches(model: Model) -> None:
    c = clusters(model)["outbound|9080||reviews.default.svc.cluster.local"]
    assert [m.name for m in c.transport_socket_matches] == ["tlsMode-istio", "tlsMode-disabled"]
    tls = tls_pb2.UpstreamTlsContext()
    c.transport_socket_matches[0].transport_socket.typed_config.Unpack(tls)
    assert tls.sni == "outbound_.9080_._.reviews.default.svc.cluster.local"
    # An Istio proxy that lists no extensions gets the exchange, as from istiod (networking/extensions.py).
    assert list(tls.common_tls_context.alpn_protocols) == ["istio-peer-exchange", "istio"]
    sans = tls.common_tls_context.combined_validation_context.default_validation_context
    assert [m.matcher.exact for m in sans.match_typed_subject_alt_names] == [
        "spiffe://cluster.local/ns/default/sa/reviews"
    ]
    assert [s.name for s in tls.common_tls_context.tls_certificate_sds_secret_configs] == ["default"]
    external = clusters(model)["outbound|443||api.example.com"]
    assert not external.transport_socket_matches, "MESH_EXTERNAL gets no auto mTLS"


def test_destination_rule_policy_and_subsets(model: Model) -> None:
    all_clusters = clusters(model)
    v1 = all_clusters["outbound|9080|v1|reviews.default.svc.cluster.local"]
    assert v1.lb_policy == cluster_pb2.Cluster.ROUND_ROBIN
    meta = json_format.MessageToDict(v1.metadata)["filterMetadata"]["istio"]
    assert meta["subset"] == "v1"
    assert meta["config"] == "/apis/networking.istio.io/v1/namespaces/default/destination-rule/reviews"
    tls = tls_pb2.UpstreamTlsContext()
    v1.transport_socket_matches[0].transport_socket.typed_config.Unpack(tls)
    assert tls.sni == "outbound_.9080_.v1_.reviews.default.svc.cluster.local"


def test_protocols_choose_upstream_options() -> None:
    docs = [
        *mesh_objects(),
        *workload("grpc", "default", "10.96.0.60", 7070, {"grpc-0": "10.1.0.61"}, port_name="grpc"),
    ]
    all_clusters = clusters(build(docs))
    options = hpo.HttpProtocolOptions()
    grpc = all_clusters["outbound|7070||grpc.default.svc.cluster.local"]
    grpc.typed_extension_protocol_options["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"].Unpack(
        options
    )
    assert options.explicit_http_config.HasField("http2_protocol_options")
    sniffed = all_clusters["outbound|6000||cache.default.svc.cluster.local"]
    sniffed.typed_extension_protocol_options["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"].Unpack(
        options
    )
    assert options.HasField("use_downstream_protocol_config")


def test_headless_dns_and_catch_all_clusters(model: Model) -> None:
    all_clusters = clusters(model)
    headless = all_clusters["outbound|5000||headless.default.svc.cluster.local"]
    assert headless.type == cluster_pb2.Cluster.ORIGINAL_DST
    assert headless.lb_policy == cluster_pb2.Cluster.CLUSTER_PROVIDED
    # istiod's BestEffortInferServiceMTLSMode: a passthrough service with no endpoints (or one
    # without a sidecar) is DISABLE, so no auto mTLS (test_peer_authentication_clusters has the rest).
    assert not headless.HasField("transport_socket") and not headless.transport_socket_matches
    dns = all_clusters["outbound|443||api.example.com"]
    assert dns.type == cluster_pb2.Cluster.STRICT_DNS
    address = dns.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address
    assert (address.address, address.port_value) == ("api.example.com", 443)
    blackhole = all_clusters["BlackHoleCluster"]
    assert blackhole.type == cluster_pb2.Cluster.STATIC and not blackhole.load_assignment.endpoints
    passthrough = all_clusters["PassthroughCluster"]
    assert passthrough.type == cluster_pb2.Cluster.ORIGINAL_DST
    inbound = all_clusters["InboundPassthroughCluster"]
    assert inbound.upstream_bind_config.source_address.address == "127.0.0.6"
    assert inbound.alt_stat_name == "PassthroughCluster;", "istiod's stat name quirk"


def test_inbound_clusters_follow_service_targets_in_redirect_mode(model: Model) -> None:
    redirect = clusters(model, INTERCEPTION_MODE="REDIRECT")
    inbound = redirect["inbound|9080||"]
    assert inbound.type == cluster_pb2.Cluster.ORIGINAL_DST
    assert inbound.upstream_bind_config.source_address.address == "127.0.0.6"
    none = clusters(model, INTERCEPTION_MODE="NONE")
    assert "inbound|9080||" not in none, "NONE mode has inbound clusters only for Sidecar ingress"


def test_sidecar_ingress_makes_a_static_inbound_cluster() -> None:
    docs = [
        *mesh_objects(),
        istio(
            "Sidecar",
            "pp",
            "default",
            {
                "workloadSelector": {"labels": {"app": "productpage"}},
                "ingress": [
                    {
                        "port": {"number": 9080, "protocol": "HTTP", "name": "http"},
                        "defaultEndpoint": "127.0.0.1:8080",
                    }
                ],
            },
        ),
    ]
    inbound = clusters(build(docs), INTERCEPTION_MODE="NONE")["inbound|9080||"]
    assert inbound.type == cluster_pb2.Cluster.STATIC
    address = inbound.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address
    assert (address.address, address.port_value) == ("127.0.0.1", 8080)
    assert not inbound.HasField("upstream_bind_config")


def test_istio_only_filters_only_for_proxies_that_report_them(model: Model) -> None:
    # Upstream Envoy lists its own extensions, none of Istio's.
    plain = clusters(model, ("envoy.filters.network.tcp_proxy",))[
        "outbound|9080||reviews.default.svc.cluster.local"
    ]
    assert not plain.filters
    plain_tls = tls_pb2.UpstreamTlsContext()
    plain.transport_socket_matches[0].transport_socket.typed_config.Unpack(plain_tls)
    assert list(plain_tls.common_tls_context.alpn_protocols) == ["istio"], (
        "no peer exchange without the filter"
    )
    # Istio's proxy lists the upstream exchange filter under the name it registers it with.
    istio_proxy = clusters(model, ("envoy.filters.network.upstream.metadata_exchange",))[
        "outbound|9080||reviews.default.svc.cluster.local"
    ]
    assert [f.name for f in istio_proxy.filters] == ["istio.metadata_exchange"]
    tls = tls_pb2.UpstreamTlsContext()
    istio_proxy.transport_socket_matches[0].transport_socket.typed_config.Unpack(tls)
    assert list(tls.common_tls_context.alpn_protocols) == ["istio-peer-exchange", "istio"]
