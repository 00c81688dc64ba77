"""What a Sidecar resource does to a proxy's listeners, routes and clusters, as istiod builds them."""

from __future__ import annotations

from typing import Any

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from support.kube import istio
from support.mesh_objects import CLIENT, mesh_objects
from support.model import Model, build

from meshpilot.model.proxy import NodeMetadata, parse_proxy
from meshpilot.model.push_request import PushRequest
from meshpilot.networking.cluster import ClusterInputs, build_clusters, parse_default_endpoint
from meshpilot.networking.route import catch_all_virtual_host
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.generators.base import GenerationContext
from meshpilot.xds.generators.lds import ListenerGenerator

LDS = "type.googleapis.com/envoy.config.listener.v3.Listener"
SELECTOR = {"labels": {"app": "productpage"}}


def with_sidecar(spec: dict[str, Any], mesh: str | None = None) -> Model:
    return build(
        [*mesh_objects(), istio("Sidecar", "pp", "default", {"workloadSelector": SELECTOR, **spec})], mesh
    )


def listeners(model: Model, **meta: Any) -> dict[str, Any]:
    proxy = model.proxy(CLIENT, meta)
    ctx = GenerationContext(proxy, model.push, model.index, PushRequest(push=model.push))
    out = {}
    for resource in ListenerGenerator().generate(ctx, WatchedResource(LDS), None) or []:
        listener = listener_pb2.Listener()
        resource.message().Unpack(listener)
        out[listener.name] = listener
    return out


def clusters(model: Model, **meta: Any) -> dict[str, Any]:
    proxy = model.proxy(CLIENT, meta)
    return {c.name: c for c in build_clusters(ClusterInputs(proxy, model.push, model.index))}


def tcp_cluster(chain: Any) -> str:
    out = tcp_proxy_pb2.TcpProxy()
    chain.filters[-1].typed_config.Unpack(out)
    return out.cluster


def hcm(chain: Any) -> Any:
    """The chain's HCM: its last filter (an inbound chain's starts with metadata exchange)."""
    out = hcm_pb2.HttpConnectionManager()
    chain.filters[-1].typed_config.Unpack(out)
    return out


# -- egress listeners ---------------------------------------------------------------------


def test_an_egress_port_makes_one_listener_on_that_port_only() -> None:
    model = with_sidecar(
        {
            "egress": [
                {
                    "port": {"number": 9080, "protocol": "HTTP", "name": "http"},
                    "bind": "127.0.1.11",
                    "hosts": ["*/*"],
                }
            ]
        }
    )
    found = listeners(model, INTERCEPTION_MODE="NONE")
    assert sorted(found) == ["127.0.1.11_9080"]
    names = {c for c in clusters(model, INTERCEPTION_MODE="NONE") if c.startswith("outbound|")}
    # Only services with port 9080, from every namespace.
    assert names == {
        "outbound|9080||productpage.default.svc.cluster.local",
        "outbound|9080||reviews.default.svc.cluster.local",
        "outbound|9080|v1|reviews.default.svc.cluster.local",
        "outbound|9080|v2|reviews.default.svc.cluster.local",
        "outbound|9080||ratings.other.svc.cluster.local",
    }


def test_an_egress_port_listener_takes_its_port_from_the_catch_all() -> None:
    model = with_sidecar(
        {
            "egress": [
                # db's port as HTTP on its own listener: the catch-all may not add a TCP chain to it.
                {
                    "port": {"number": 3306, "protocol": "TCP", "name": "tcp"},
                    "bind": "127.0.1.11",
                    "hosts": ["./db.default.svc.cluster.local"],
                },
                {"bind": "127.0.1.11", "hosts": ["./*"]},
            ]
        }
    )
    found = listeners(model, INTERCEPTION_MODE="NONE")
    assert "127.0.1.11_3306" in found and "127.0.1.11_9080" in found
    listener = found["127.0.1.11_3306"]
    assert [tcp_cluster(c) for c in listener.filter_chains] == ["outbound|3306||db.default.svc.cluster.local"]


def test_egress_listener_without_bind_in_none_mode_binds_localhost() -> None:
    model = with_sidecar({"egress": [{"hosts": ["./reviews.default.svc.cluster.local"]}]})
    found = listeners(model, INTERCEPTION_MODE="NONE")
    assert sorted(found) == ["127.0.0.1_9080"]
    assert not found["127.0.0.1_9080"].HasField("bind_to_port"), "bound for real"


def test_capture_none_binds_one_listener_in_redirect_mode() -> None:
    model = with_sidecar(
        {
            "egress": [
                {
                    "port": {"number": 9080, "protocol": "HTTP", "name": "http"},
                    "captureMode": "NONE",
                    "hosts": ["./reviews.default.svc.cluster.local"],
                },
                {"hosts": ["./*"]},
            ]
        }
    )
    found = listeners(model, INTERCEPTION_MODE="REDIRECT")
    assert not found["127.0.0.1_9080"].HasField("bind_to_port")
    assert found["10.96.0.40_3306"].bind_to_port.value is False
    assert "virtualOutbound" in found


@pytest.mark.parametrize(
    ("mesh_mode", "sidecar_mode", "expected"),
    [
        ("ALLOW_ANY", None, "allow_any"),
        ("REGISTRY_ONLY", None, "block_all"),
        ("REGISTRY_ONLY", "ALLOW_ANY", "allow_any"),
        ("ALLOW_ANY", "REGISTRY_ONLY", "block_all"),
    ],
)
def test_outbound_traffic_policy_decides_the_catch_alls(mesh_mode, sidecar_mode, expected) -> None:
    spec: dict[str, Any] = {"egress": [{"hosts": ["./*"]}]}
    if sidecar_mode:
        spec["outboundTrafficPolicy"] = {"mode": sidecar_mode}
    model = with_sidecar(spec, f"outboundTrafficPolicy: {{mode: {mesh_mode}}}")
    proxy = model.proxy(CLIENT, {"INTERCEPTION_MODE": "REDIRECT"})
    vhost = catch_all_virtual_host(proxy)
    assert vhost.name == expected
    if expected == "block_all":
        assert vhost.routes[0].direct_response.status == 502
    else:
        assert vhost.routes[0].route.cluster == "PassthroughCluster"
    virtual = listeners(model, INTERCEPTION_MODE="REDIRECT")["virtualOutbound"]
    catch_all = next(c for c in virtual.filter_chains if c.name == "virtualOutbound-catchall-tcp")
    assert tcp_cluster(catch_all) == ("PassthroughCluster" if expected == "allow_any" else "BlackHoleCluster")


# -- ingress listeners ---------------------------------------------------------------------


def ingress(port: int, **extra: Any) -> dict[str, Any]:
    return {"port": {"number": port, "protocol": extra.pop("protocol", "HTTP"), "name": f"p{port}"}, **extra}


def test_ingress_bind_defaults_to_the_global_unicast_ip() -> None:
    model = with_sidecar(
        {"ingress": [ingress(9080, defaultEndpoint="127.0.0.1:8080"), ingress(9090, bind="127.0.0.11")]}
    )
    found = listeners(model, INTERCEPTION_MODE="NONE")
    assert {"10.1.0.11_9080", "127.0.0.11_9090"} <= set(found)
    # The route's decorator names the Sidecar: its ports have no real hostname.
    route = hcm(found["10.1.0.11_9080"].filter_chains[-1]).route_config.virtual_hosts[0].routes[0]
    assert route.decorator.operation == "pp.default:9080/*"


def test_ingress_on_a_loopback_proxy_binds_the_wildcard() -> None:
    docs = [
        *mesh_objects(),
        istio("Sidecar", "pp", "default", {"ingress": [ingress(9080, defaultEndpoint="127.0.0.1:8080")]}),
    ]
    model = build(docs)
    proxy = parse_proxy(
        "sidecar~127.0.0.9~x.default~default.svc.cluster.local",
        NodeMetadata.parse({"NAMESPACE": "default", "INTERCEPTION_MODE": "NONE"}),
    )
    model.env.refresh_proxy(proxy, model.push)
    ctx = GenerationContext(proxy, model.push, model.index, PushRequest(push=model.push))
    names = [r.name for r in ListenerGenerator().generate(ctx, WatchedResource(LDS), None) or []]
    assert "0.0.0.0_9080" in names


def test_ingress_ports_envoy_cannot_bind_are_skipped() -> None:
    model = with_sidecar(
        {
            "ingress": [
                ingress(15021, bind="0.0.0.0", defaultEndpoint="127.0.0.1:8080"),
                ingress(80, bind="127.0.0.11", defaultEndpoint="127.0.0.1:8081"),
                ingress(9080, bind="127.0.0.11", defaultEndpoint="127.0.0.1:8082"),
            ]
        }
    )
    found = listeners(model, INTERCEPTION_MODE="NONE", UNPRIVILEGED_POD="true")
    inbound = sorted(n for n, item in found.items() if item.traffic_direction == 1)
    assert inbound == ["127.0.0.11_9080"]
    privileged = listeners(model, INTERCEPTION_MODE="NONE")
    inbound = sorted(n for n, item in privileged.items() if item.traffic_direction == 1)
    assert inbound == ["127.0.0.11_80", "127.0.0.11_9080"], "15021 clashes with Envoy's health listener"


def test_ingress_in_capture_mode_joins_virtual_inbound_unless_capture_none() -> None:
    model = with_sidecar(
        {
            "ingress": [
                ingress(9080, defaultEndpoint="127.0.0.1:8080"),
                ingress(9090, captureMode="NONE", bind="127.0.0.11", defaultEndpoint="127.0.0.1:8090"),
            ]
        }
    )
    found = listeners(model, INTERCEPTION_MODE="REDIRECT")
    virtual = found["virtualInbound"]
    assert any(c.name == "10.1.0.11_9080" for c in virtual.filter_chains)
    assert "127.0.0.11_9090" in found
    assert not any(c.name.endswith("_9090") for c in virtual.filter_chains)


@pytest.mark.parametrize(
    ("endpoint", "ips", "expected"),
    [
        ("127.0.0.1:8080", ("10.1.0.11",), ("127.0.0.1", 8080)),
        ("0.0.0.0:8080", ("fd00::1", "10.1.0.11"), ("10.1.0.11", 8080)),
        ("0.0.0.0:8080", ("fd00::1",), ("127.0.0.1", 8080)),
        ("[::]:8080", ("10.1.0.11", "fd00::1"), ("fd00::1", 8080)),
        ("[::]:8080", ("10.1.0.11",), ("::1", 8080)),
        ("[::1]:8080", ("10.1.0.11",), ("::1", 8080)),
        ("unix:///var/run/app.sock", ("10.1.0.11",), ("unix:///var/run/app.sock", 0)),
        ("127.0.0.1:http", ("10.1.0.11",), None),
        ("nonsense", ("10.1.0.11",), None),
    ],
)
def test_default_endpoint_addresses(endpoint, ips, expected) -> None:
    proxy = parse_proxy(
        "sidecar~10.1.0.11~x.default~default.svc.cluster.local",
        NodeMetadata.parse({"NAMESPACE": "default", "INSTANCE_IPS": ",".join(ips)}),
    )
    assert parse_default_endpoint(endpoint, proxy) == expected


def test_ingress_clusters_by_default_endpoint() -> None:
    model = with_sidecar(
        {
            "ingress": [
                ingress(9080, defaultEndpoint="127.0.0.1:8080"),
                ingress(9081, defaultEndpoint="0.0.0.0:8081"),
                ingress(9082, defaultEndpoint="unix:///var/run/app.sock"),
                ingress(9083),
            ]
        }
    )
    found = clusters(model, INTERCEPTION_MODE="NONE")
    loopback = found["inbound|9080||"]
    assert loopback.type == cluster_pb2.Cluster.STATIC
    assert not loopback.HasField("upstream_bind_config"), "no magic source address to loopback"
    # productpage serves 9080: its service names the cluster's telemetry metadata.
    services = loopback.metadata.filter_metadata["istio"]["services"]
    assert [s["host"] for s in services] == ["productpage.default.svc.cluster.local"]
    pod_ip = found["inbound|9081||"]
    address = pod_ip.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address
    assert (address.address, address.port_value) == ("10.1.0.11", 8081)
    assert pod_ip.upstream_bind_config.source_address.address == "127.0.0.6"
    assert "istio" not in pod_ip.metadata.filter_metadata, "no service serves 9081"
    unix = found["inbound|9082||"]
    assert unix.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.pipe.path == "/var/run/app.sock"
    passthrough = found["inbound|9083||"]
    assert passthrough.type == cluster_pb2.Cluster.ORIGINAL_DST


def test_sidecar_connection_pools_limit_inbound_clusters() -> None:
    pool = {"tcp": {"maxConnections": 7}}
    model = with_sidecar(
        {
            "inboundConnectionPool": pool,
            "ingress": [
                ingress(9080, defaultEndpoint="127.0.0.1:8080"),
                ingress(
                    9090,
                    defaultEndpoint="127.0.0.1:8090",
                    connectionPool={"http": {"http1MaxPendingRequests": 3, "idleTimeout": "5s"}},
                ),
            ],
        }
    )
    found = clusters(model, INTERCEPTION_MODE="NONE")
    whole = found["inbound|9080||"].circuit_breakers.thresholds[0]
    assert whole.max_connections.value == 7
    own = found["inbound|9090||"].circuit_breakers.thresholds[0]
    assert own.max_pending_requests.value == 3, "an ingress listener's own pool wins"
    assert own.max_connections.value == 2**32 - 1
    # Without ingress listeners the Sidecar's pool still applies to the service ports.
    captured = clusters(with_sidecar({"inboundConnectionPool": pool}), INTERCEPTION_MODE="REDIRECT")
    assert captured["inbound|9080||"].circuit_breakers.thresholds[0].max_connections.value == 7
    plain = clusters(build(mesh_objects()), INTERCEPTION_MODE="REDIRECT")
    assert plain["inbound|9080||"].circuit_breakers.thresholds[0].max_connections.value == 2**32 - 1


def test_egress_proxy_takes_unknown_tcp_traffic() -> None:
    policy = {"mode": "ALLOW_ANY", "egressProxy": {"host": "egress.example.com", "port": {"number": 8443}}}
    model = with_sidecar({"egress": [{"hosts": ["./*"]}], "outboundTrafficPolicy": policy})
    found = listeners(model, INTERCEPTION_MODE="REDIRECT")
    virtual = found["virtualOutbound"]
    catch_all = next(c for c in virtual.filter_chains if c.name == "virtualOutbound-catchall-tcp")
    assert tcp_cluster(catch_all) == "outbound|8443||egress.example.com"
    http = found["0.0.0.0_9080"]
    assert http.default_filter_chain.name == "PassthroughFilterChain"
    assert tcp_cluster(http.default_filter_chain) == "outbound|8443||egress.example.com"


def test_merged_rules_take_tls_from_a_later_rule_when_the_first_has_no_policy() -> None:
    ratings = "ratings.other.svc.cluster.local"
    docs = [
        *mesh_objects(),
        istio(
            "DestinationRule",
            "a-subsets",
            "other",
            {"host": ratings, "subsets": [{"name": "v1", "labels": {"v": "1"}}]},
        ),
        istio(
            "DestinationRule",
            "b-tls",
            "other",
            {"host": ratings, "trafficPolicy": {"tls": {"mode": "DISABLE"}}},
        ),
    ]
    found = clusters(build(docs), INTERCEPTION_MODE="REDIRECT")
    cluster = found[f"outbound|9080||{ratings}"]
    assert not cluster.transport_socket_matches, "TLS DISABLE from the second rule: no auto mTLS"
    assert f"outbound|9080|v1|{ratings}" in found
    plain = clusters(build(mesh_objects()), INTERCEPTION_MODE="REDIRECT")[f"outbound|9080||{ratings}"]
    assert plain.transport_socket_matches, "auto mTLS without any rule"


def test_egress_proxy_takes_unknown_http_traffic_on_the_allow_any_host() -> None:
    from meshpilot.networking.route import build_route_configuration, encode_route_configuration

    policy = {"mode": "ALLOW_ANY", "egressProxy": {"host": "egress.example.com", "port": {"number": 8443}}}
    model = with_sidecar({"egress": [{"hosts": ["./*"]}], "outboundTrafficPolicy": policy})
    proxy = model.proxy(CLIENT, {"INTERCEPTION_MODE": "REDIRECT"})
    config = build_route_configuration(proxy, model.push, "9080")
    catch_all = config.virtual_hosts[-1]
    assert catch_all.name == "allow_any"
    assert catch_all.routes[0].route.cluster == "outbound|8443||egress.example.com"
    encoded = type(config).FromString(encode_route_configuration(proxy, model.push, "9080"))
    assert encoded == config
    # Without an egressProxy the same host passes traffic through.
    plain = with_sidecar({"egress": [{"hosts": ["./*"]}], "outboundTrafficPolicy": {"mode": "ALLOW_ANY"}})
    plain_config = build_route_configuration(plain.proxy(CLIENT), plain.push, "9080")
    assert plain_config.virtual_hosts[-1].routes[0].route.cluster == "PassthroughCluster"
