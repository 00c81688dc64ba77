"""AUTO_PASSTHROUGH gateway servers (east-west gateways): chains by the SNI of mesh mTLS, SNI-DNAT
clusters of the same names, and endpoints limited to those that take Istio mTLS."""

from __future__ import annotations

from collections import Counter
from typing import Any

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from support.kube import endpoint_slice, istio, pod, service
from support.model import Model, build

from meshpilot.model.config import ConfigKey
from meshpilot.model.kind import Kind
from meshpilot.model.proxy import Proxy
from meshpilot.model.push_request import PushRequest
from meshpilot.networking import names
from meshpilot.networking.endpoint import build_cluster_load_assignment, encode_cluster_load_assignment
from meshpilot.networking.gateway import gateway_listeners
from meshpilot.networking.policy_problems import PROBLEMS
from meshpilot.xds.cache import XdsCache
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.generators import sidecar_generators
from meshpilot.xds.generators.base import GenerationContext
from meshpilot.xds.types import TypeUrl

GATEWAY = "router~10.1.0.200~ewgw-1.istio-system~istio-system.svc.cluster.local"
LABELS = {"LABELS": {"istio": "eastwestgateway"}}
REVIEWS = "reviews.default.svc.cluster.local"
AUTO = {
    "port": {"number": 15443, "name": "tls", "protocol": "TLS"},
    "hosts": ["*.local"],
    "tls": {"mode": "AUTO_PASSTHROUGH"},
}


def _objects(*servers: dict[str, Any]) -> list[dict[str, Any]]:
    """reviews with an injected pod (v1) and a plaintext one (v2), subsets, an internal ServiceEntry
    outside ``*.local``, an external one, and a gateway with ``servers``."""
    return [
        pod("ewgw-1", "istio-system", "10.1.0.200", {"istio": "eastwestgateway"}),
        service("reviews", "default", "10.96.0.20", [("http", 9080), ("tcp-db", 3306)], {"app": "reviews"}),
        pod(
            "reviews-v1",
            "default",
            "10.1.0.21",
            {"app": "reviews", "version": "v1", "security.istio.io/tlsMode": "istio"},
        ),
        pod("reviews-v2", "default", "10.1.0.22", {"app": "reviews", "version": "v2"}),
        endpoint_slice(
            "reviews-slice",
            "default",
            "reviews",
            [("http", 9080), ("tcp-db", 3306)],
            [("reviews-v1", "10.1.0.21"), ("reviews-v2", "10.1.0.22")],
        ),
        istio(
            "DestinationRule",
            "reviews",
            "default",
            {
                "host": REVIEWS,
                "trafficPolicy": {"connectionPool": {"tcp": {"idleTimeout": "30s"}}},
                "subsets": [
                    {"name": "v1", "labels": {"version": "v1"}},
                    {"name": "v2", "labels": {"version": "v2"}},
                ],
            },
        ),
        istio(
            "ServiceEntry",
            "ledger",
            "default",
            {
                "hosts": ["ledger.internal"],
                "location": "MESH_INTERNAL",
                "resolution": "DNS",
                "ports": [{"number": 7070, "name": "tcp", "protocol": "TCP"}],
                "endpoints": [
                    {"address": "10.2.0.1", "labels": {"security.istio.io/tlsMode": "istio"}},
                    {"address": "10.2.0.2"},
                ],
            },
        ),
        istio(
            "ServiceEntry",
            "external-api",
            "default",
            {
                "hosts": ["api.example.com"],
                "location": "MESH_EXTERNAL",
                "resolution": "DNS",
                "ports": [{"number": 443, "name": "https", "protocol": "TLS"}],
            },
        ),
        istio(
            "Gateway",
            "cross-network",
            "istio-system",
            {"selector": {"istio": "eastwestgateway"}, "servers": list(servers)},
        ),
    ]


def _generate(
    model: Model, proxy: Proxy, type_url: TypeUrl, names: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """Resources by name as the generator makes them, each parsed into its message."""
    request = PushRequest(full=True, forced=True, reasons=Counter(), push=model.push)
    ctx = GenerationContext(proxy, model.push, model.index, request, cache=XdsCache())
    watch = WatchedResource(type_url.value, names, wildcard=not names)
    message = {
        TypeUrl.CLUSTER: cluster_pb2.Cluster,
        TypeUrl.LISTENER: listener_pb2.Listener,
        TypeUrl.ENDPOINT: endpoint_pb2.ClusterLoadAssignment,
    }[type_url]
    out = {}
    for resource in sidecar_generators()[type_url].generate(ctx, watch, None) or []:
        parsed = message()
        resource.message().Unpack(parsed)
        out[resource.name] = parsed
    return out


def _tcp_proxy(chain: Any) -> Any:
    config = tcp_proxy_pb2.TcpProxy()
    chain.filters[-1].typed_config.Unpack(config)
    return config


def test_the_sni_form_of_a_cluster_name_parses_as_istiod_reads_it() -> None:
    assert names.parse_cluster(f"outbound_.9080_.v1_.{REVIEWS}") == ("outbound", 9080, "v1", REVIEWS)
    assert names.parse_cluster(f"outbound_.9080_._.{REVIEWS}") == ("outbound", 9080, "", REVIEWS)
    assert names.parse_cluster(f"outbound|9080||{REVIEWS}") == ("outbound", 9080, "", REVIEWS)
    # A host holding the separator is not read as one, as in istiod.
    assert names.parse_cluster("outbound_.9080_._.a_.b.local") is None
    assert names.parse_cluster("outbound_.x_._.a.local") is None


def test_a_chain_per_cluster_of_each_service_within_the_hosts_matching_its_sni_and_istio_alpns() -> None:
    model = build(_objects(AUTO))
    listeners = gateway_listeners(model.proxy(GATEWAY, LABELS), model.push)
    assert [li.name for li in listeners] == ["0.0.0.0_15443"]
    listener = listeners[0]
    assert [f.name for f in listener.listener_filters] == ["envoy.filters.listener.tls_inspector"]
    sni = [list(c.filter_chain_match.server_names) for c in listener.filter_chains]
    assert all(len(s) == 1 for s in sni)
    # Every port and subset of reviews; not ledger.internal (outside *.local) nor the external entry.
    assert [s[0] for s in sni] == [
        f"outbound_.9080_._.{REVIEWS}",
        f"outbound_.9080_.v1_.{REVIEWS}",
        f"outbound_.9080_.v2_.{REVIEWS}",
        f"outbound_.3306_._.{REVIEWS}",
        f"outbound_.3306_.v1_.{REVIEWS}",
        f"outbound_.3306_.v2_.{REVIEWS}",
    ]
    chain = listener.filter_chains[1]
    assert list(chain.filter_chain_match.application_protocols) == [
        "istio",
        "istio-peer-exchange",
        "istio-http/1.0",
        "istio-http/1.1",
        "istio-h2",
    ]
    assert not chain.HasField("transport_socket")
    assert chain.transport_socket_connect_timeout.seconds == 15
    proxied = _tcp_proxy(chain)
    assert proxied.cluster == proxied.stat_prefix == f"outbound_.9080_.v1_.{REVIEWS}"
    # The DestinationRule's TCP settings apply, as on the outbound tcp_proxy.
    assert proxied.idle_timeout.seconds == 30


def test_the_server_hosts_choose_the_services() -> None:
    server = {**AUTO, "hosts": ["ledger.internal"]}
    model = build(_objects(server))
    (listener,) = gateway_listeners(model.proxy(GATEWAY, LABELS), model.push)
    assert [c.filter_chain_match.server_names[0] for c in listener.filter_chains] == [
        "outbound_.7070_._.ledger.internal"
    ]


def test_a_router_without_matching_services_gets_no_listener() -> None:
    model = build(_objects({**AUTO, "hosts": ["*.nowhere.example"]}))
    assert gateway_listeners(model.proxy(GATEWAY, LABELS), model.push) == []


def test_no_authorization_filters_on_auto_passthrough_chains() -> None:
    deny = istio(
        "AuthorizationPolicy",
        "deny-all",
        "istio-system",
        {"selector": {"matchLabels": {"istio": "eastwestgateway"}}, "action": "DENY", "rules": [{}]},
        group="security",
    )
    model = build([*_objects(AUTO), deny])
    (listener,) = gateway_listeners(model.proxy(GATEWAY, LABELS), model.push)
    assert all(
        [f.name for f in c.filters] == ["envoy.filters.network.tcp_proxy"] for c in listener.filter_chains
    )


def test_a_server_repeating_hosts_on_its_port_is_counted_not_served() -> None:
    before = PROBLEMS.count("Gateway", "istio-system/cross-network")
    model = build(_objects(AUTO, {**AUTO, "port": {"number": 15443, "name": "tls-2", "protocol": "TLS"}}))
    (listener,) = gateway_listeners(model.proxy(GATEWAY, LABELS), model.push)
    assert len(listener.filter_chains) == 6
    assert PROBLEMS.count("Gateway", "istio-system/cross-network") == before + 1


def test_sni_dnat_clusters_are_the_outbound_ones_under_the_sni_name_without_tls() -> None:
    model = build(_objects(AUTO))
    clusters = _generate(model, model.proxy(GATEWAY, LABELS), TypeUrl.CLUSTER)
    sni = sorted(n for n in clusters if names.is_sni_cluster(n))
    # Every in-mesh service, whatever the server's hosts: ledger.internal too, not the external one.
    assert sni == sorted(
        [
            *(f"outbound_.{p}_.{s}_.{REVIEWS}" for p in (9080, 3306) for s in ("", "v1", "v2")),
            "outbound_.7070_._.ledger.internal",
        ]
    )
    plain, dnat = clusters[f"outbound|9080|v1|{REVIEWS}"], clusters[f"outbound_.9080_.v1_.{REVIEWS}"]
    assert plain.transport_socket_matches  # auto mTLS on the ordinary cluster
    assert not dnat.transport_socket_matches and not dnat.HasField("transport_socket")
    assert dnat.eds_cluster_config.service_name == dnat.name
    assert dnat.alt_stat_name == f"{dnat.name};"
    assert dnat.metadata.filter_metadata["istio"]["subset"] == "v1"
    # DNS clusters carry only their mTLS endpoints.
    ledger = clusters["outbound_.7070_._.ledger.internal"]
    assert ledger.load_assignment.cluster_name == ledger.name
    addresses = [
        e.endpoint.address.socket_address.address
        for g in ledger.load_assignment.endpoints
        for e in g.lb_endpoints
    ]
    assert addresses == ["10.2.0.1"]
    assert ledger.load_assignment.endpoints[0].load_balancing_weight.value == 1


def test_only_routers_with_an_auto_passthrough_server_get_sni_dnat_clusters() -> None:
    passthrough = {**AUTO, "tls": {"mode": "PASSTHROUGH"}}
    model = build(_objects(passthrough))
    clusters = _generate(model, model.proxy(GATEWAY, LABELS), TypeUrl.CLUSTER)
    assert clusters and not any(names.is_sni_cluster(n) for n in clusters)


def test_sni_dnat_endpoints_are_only_those_that_take_istio_mtls() -> None:
    model = build(_objects(AUTO))
    proxy = model.proxy(GATEWAY, LABELS)
    default, v2 = f"outbound_.9080_._.{REVIEWS}", f"outbound_.9080_.v2_.{REVIEWS}"
    found = _generate(model, proxy, TypeUrl.ENDPOINT, frozenset({default, v2, f"outbound|9080||{REVIEWS}"}))
    addresses = {
        name: [e.endpoint.address.socket_address.address for g in cla.endpoints for e in g.lb_endpoints]
        for name, cla in found.items()
    }
    assert addresses == {
        default: ["10.1.0.21"],
        v2: [],
        f"outbound|9080||{REVIEWS}": ["10.1.0.21", "10.1.0.22"],
    }
    assert found[default].endpoints[0].load_balancing_weight.value == 1
    # A locality whose endpoints were all plaintext stays, without a weight, as istiod sends it.
    assert len(found[v2].endpoints) == 1
    assert not found[v2].endpoints[0].HasField("load_balancing_weight")
    # The wire encoder and the protobuf builder agree.
    for name in (default, v2):
        built = build_cluster_load_assignment(name, proxy, model.push, model.index)
        encoded = encode_cluster_load_assignment(name, proxy, model.push, model.index)
        assert endpoint_pb2.ClusterLoadAssignment.FromString(encoded) == built == found[name]


def test_a_gateway_change_regenerates_clusters() -> None:
    cds = sidecar_generators()[TypeUrl.CLUSTER]
    change = PushRequest(
        full=True, configs_updated=frozenset({ConfigKey(Kind.GATEWAY, "cross-network", "istio-system")})
    )
    assert cds.needs_push(change)
