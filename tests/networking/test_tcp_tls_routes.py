"""VirtualService tcp and tls routes in outbound listeners, as istiod's tls.go builds them."""

from __future__ import annotations

from typing import Any

from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from google.protobuf import json_format
from support.kube import istio
from support.mesh_objects import CLIENT, mesh_objects
from support.model import Model, build

from meshpilot.model.push_request import PushRequest
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.generators.base import GenerationContext
from meshpilot.xds.generators.lds import ListenerGenerator

LDS = "type.googleapis.com/envoy.config.listener.v3.Listener"

REDIRECT = {"INTERCEPTION_MODE": "REDIRECT"}
DB = "outbound|3306||db.default.svc.cluster.local"
DB_RULE = istio(
    "DestinationRule",
    "db",
    "default",
    {
        "host": "db",
        "trafficPolicy": {"connectionPool": {"tcp": {"idleTimeout": "30s"}}},
        "subsets": [{"name": "v1", "labels": {"version": "v1"}}, {"name": "v2", "labels": {"version": "v2"}}],
    },
)


def listeners(model: Model, node: str = CLIENT, **meta: Any) -> dict[str, Any]:
    proxy = model.proxy(node, meta)
    ctx = GenerationContext(proxy, model.push, model.index, PushRequest(push=model.push))
    out = {}
    for resource in ListenerGenerator().generate(ctx, WatchedResource(LDS), None) or []:
        listener = listener_pb2.Listener()
        resource.message().Unpack(listener)
        out[listener.name] = listener
    return out


def vs(name: str, spec: dict[str, Any], namespace: str = "default") -> dict[str, Any]:
    return istio("VirtualService", name, namespace, spec)


def proxy_of(chain: Any) -> Any:
    out = tcp_proxy_pb2.TcpProxy()
    assert chain.filters[-1].name == "envoy.filters.network.tcp_proxy"
    chain.filters[-1].typed_config.Unpack(out)
    return out


def target(chain: Any) -> str | dict[str, int]:
    proxy = proxy_of(chain)
    if proxy.HasField("weighted_clusters"):
        return {c.name: c.weight for c in proxy.weighted_clusters.clusters}
    return str(proxy.cluster)


def chains(listener: Any) -> list[tuple[dict[str, Any], str | dict[str, int]]]:
    """(match as JSON, target) of every chain, the default chain last with match {}."""
    out = [(json_format.MessageToDict(c.filter_chain_match), target(c)) for c in listener.filter_chains]
    if listener.HasField("default_filter_chain"):
        out.append(({}, target(listener.default_filter_chain)))
    return out


def build_with(*docs: dict[str, Any]) -> Any:
    return build([*mesh_objects(), DB_RULE, *docs])


def test_weighted_tcp_route_to_subsets() -> None:
    route = vs(
        "db",
        {
            "hosts": ["db"],
            "tcp": [
                {
                    "route": [
                        {"destination": {"host": "db", "subset": "v1"}, "weight": 80},
                        {
                            "destination": {"host": "db.default.svc.cluster.local", "subset": "v2"},
                            "weight": 20,
                        },
                    ]
                }
            ],
        },
    )
    listener = listeners(build_with(route), **REDIRECT)["10.96.0.40_3306"]
    [chain] = listener.filter_chains
    proxy = proxy_of(chain)
    assert proxy.stat_prefix == "db.default"
    assert target(chain) == {
        "outbound|3306|v1|db.default.svc.cluster.local": 80,
        "outbound|3306|v2|db.default.svc.cluster.local": 20,
    }
    assert proxy.idle_timeout.seconds == 30  # from the DestinationRule's connection pool
    assert json_format.MessageToDict(chain.metadata) == {
        "filterMetadata": {
            "istio": {"config": "/apis/networking.istio.io/v1/namespaces/default/virtual-service/db"}
        }
    }


def test_single_destination_with_subset_and_port() -> None:
    route = vs(
        "db",
        {
            "hosts": ["db"],
            "tcp": [{"route": [{"destination": {"host": "db", "subset": "v2", "port": {"number": 3306}}}]}],
        },
    )
    listener = listeners(build_with(route), **REDIRECT)["10.96.0.40_3306"]
    assert chains(listener) == [({}, "outbound|3306|v2|db.default.svc.cluster.local")]
    assert proxy_of(listener.filter_chains[0]).stat_prefix == "outbound|3306|v2|db.default.svc.cluster.local"


def test_destination_subnets_become_prefix_ranges_before_the_default() -> None:
    route = vs(
        "db",
        {
            "hosts": ["db"],
            "tcp": [
                {
                    "match": [
                        {"destinationSubnets": ["10.96.0.0/16"]},
                        {"destinationSubnets": ["192.168.1.7"]},
                    ],
                    "route": [{"destination": {"host": "db", "subset": "v1"}}],
                }
            ],
        },
    )
    listener = listeners(build_with(route), **REDIRECT)["10.96.0.40_3306"]
    assert chains(listener) == [
        (
            {
                "prefixRanges": [
                    {"addressPrefix": "10.96.0.0", "prefixLen": 16},
                    {"addressPrefix": "192.168.1.7", "prefixLen": 32},
                ]
            },
            "outbound|3306|v1|db.default.svc.cluster.local",
        ),
        ({}, DB),
    ]
    # The subnet-only chain carries no config metadata, as in istiod.
    assert not listener.filter_chains[0].HasField("metadata")


def test_static_predicates_pick_the_first_route_that_applies() -> None:
    route = vs(
        "db",
        {
            "hosts": ["db"],
            "tcp": [
                {
                    "match": [{"sourceLabels": {"app": "other"}}],
                    "route": [{"destination": {"host": "db", "subset": "v1"}}],
                },
                {
                    "match": [{"gateways": ["istio-system/gw"]}],
                    "route": [{"destination": {"host": "db", "subset": "v1"}}],
                },
                {"match": [{"port": 1234}], "route": [{"destination": {"host": "db", "subset": "v1"}}]},
                {
                    "match": [{"sourceNamespace": "other"}],
                    "route": [{"destination": {"host": "db", "subset": "v1"}}],
                },
                {
                    "match": [
                        {"sourceLabels": {"app": "productpage"}, "sourceNamespace": "default", "port": 3306}
                    ],
                    "route": [{"destination": {"host": "db", "subset": "v2"}}],
                },
                {"route": [{"destination": {"host": "db", "subset": "v1"}}]},
            ],
        },
    )
    model = build_with(route)
    listener = listeners(model, **REDIRECT)["10.96.0.40_3306"]  # the productpage Pod
    assert chains(listener) == [({}, "outbound|3306|v2|db.default.svc.cluster.local")]
    # Another workload of the same scope, without the labels: listeners are not shared.
    vm = "sidecar~10.1.0.99~vm.default~default.svc.cluster.local"
    other = listeners(model, vm, **REDIRECT, LABELS={"app": "somethingelse"})["10.96.0.40_3306"]
    assert chains(other) == [({}, "outbound|3306|v1|db.default.svc.cluster.local")]


def test_a_virtual_service_for_another_host_or_gateway_changes_nothing() -> None:
    docs = [
        vs(
            "elsewhere",
            {"hosts": ["reviews"], "tcp": [{"route": [{"destination": {"host": "db", "subset": "v1"}}]}]},
        ),
        vs(
            "gateway-only",
            {
                "hosts": ["db"],
                "gateways": ["gw"],
                "tcp": [{"route": [{"destination": {"host": "db", "subset": "v1"}}]}],
            },
        ),
    ]
    listener = listeners(build_with(*docs), **REDIRECT)["10.96.0.40_3306"]
    assert chains(listener) == [({}, DB)]


def test_tls_routes_match_sni_with_the_tls_inspector() -> None:
    entry = istio(
        "ServiceEntry",
        "wild",
        "default",
        {
            "hosts": ["*.tls.example"],
            "location": "MESH_EXTERNAL",
            "resolution": "NONE",
            "ports": [{"number": 8443, "name": "tls", "protocol": "TLS"}],
        },
    )
    route = vs(
        "wild",
        {
            "hosts": ["*.tls.example"],
            "tls": [
                {
                    "match": [{"sniHosts": ["b.tls.example", "a.tls.example"]}],
                    "route": [{"destination": {"host": "db", "subset": "v1", "port": {"number": 3306}}}],
                },
                # The same runtime predicates again: unreachable, left out.
                {
                    "match": [{"sniHosts": ["b.tls.example", "a.tls.example"]}],
                    "route": [{"destination": {"host": "db", "subset": "v2", "port": {"number": 3306}}}],
                },
                {
                    "match": [{"sniHosts": ["c.tls.example"], "destinationSubnets": ["10.0.0.0/8"]}],
                    "route": [
                        {"destination": {"host": "reviews", "subset": "v1"}, "weight": 50},
                        {"destination": {"host": "reviews", "subset": "v2"}, "weight": 50},
                    ],
                },
            ],
        },
    )
    listener = listeners(build_with(entry, route), **REDIRECT)["0.0.0.0_8443"]
    assert [f.name for f in listener.listener_filters] == ["envoy.filters.listener.tls_inspector"]
    assert chains(listener) == [
        (
            {"serverNames": ["a.tls.example", "b.tls.example"]},
            "outbound|3306|v1|db.default.svc.cluster.local",
        ),
        (
            {
                "serverNames": ["c.tls.example"],
                "prefixRanges": [{"addressPrefix": "10.0.0.0", "prefixLen": 8}],
            },
            {
                "outbound|9080|v1|reviews.default.svc.cluster.local": 50,
                "outbound|9080|v2|reviews.default.svc.cluster.local": 50,
            },
        ),
        ({}, "PassthroughCluster"),
    ]
    assert listener.default_filter_chain.name == "PassthroughFilterChain"


def test_tls_port_without_route_matches_its_host_on_the_wildcard_listener() -> None:
    listener = listeners(build_with(), **REDIRECT)["0.0.0.0_443"]
    assert chains(listener) == [
        ({"serverNames": ["api.example.com"]}, "outbound|443||api.example.com"),
        ({}, "PassthroughCluster"),
    ]
    assert [f.name for f in listener.listener_filters] == ["envoy.filters.listener.tls_inspector"]


def test_cidr_service_entry_listens_on_the_wildcard_with_prefix_ranges() -> None:
    entry = istio(
        "ServiceEntry",
        "range",
        "default",
        {
            "hosts": ["range.example"],
            "addresses": ["10.20.0.0/16", "10.30.0.1/32"],
            "location": "MESH_EXTERNAL",
            "resolution": "NONE",
            "ports": [{"number": 7000, "name": "tcp", "protocol": "TCP"}],
        },
    )
    found = listeners(build_with(entry), **REDIRECT)
    assert chains(found["0.0.0.0_7000"]) == [
        ({"prefixRanges": [{"addressPrefix": "10.20.0.0", "prefixLen": 16}]}, "outbound|7000||range.example"),
        ({}, "PassthroughCluster"),
    ]
    # A /32 is an address: it gets a listener of its own.
    assert chains(found["10.30.0.1_7000"]) == [({}, "outbound|7000||range.example")]


def test_tcp_route_on_a_sniffed_port_keeps_the_http_chain() -> None:
    route = vs("cache", {"hosts": ["cache"], "tcp": [{"route": [{"destination": {"host": "db"}}]}]})
    listener = listeners(build_with(route), **REDIRECT)["10.96.0.50_6000"]
    assert target(listener.default_filter_chain) == DB
    [http] = listener.filter_chains
    assert list(http.filter_chain_match.application_protocols) == ["http/1.1", "h2c"]
    assert http.filters[0].name == "envoy.filters.network.http_connection_manager"


def test_clients_routes_reach_envoy_shapes_in_none_mode() -> None:
    """With a bound egress listener, a route without subnets is the listener's only chain."""
    route = vs("db", {"hosts": ["db"], "tcp": [{"route": [{"destination": {"host": "db", "subset": "v1"}}]}]})
    found = listeners(build_with(route), INTERCEPTION_MODE="NONE")
    assert chains(found["127.0.0.1_3306"]) == [({}, "outbound|3306|v1|db.default.svc.cluster.local")]


def test_tls_services_without_addresses_share_the_wildcard_listener_by_sni() -> None:
    def tls_entry(name: str) -> dict[str, Any]:
        spec = {
            "hosts": [f"{name}.example.org"],
            "location": "MESH_EXTERNAL",
            "resolution": "DNS",
            "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}],
        }
        return istio("ServiceEntry", name, "default", spec)

    listener = listeners(build_with(tls_entry("one"), tls_entry("two")), **REDIRECT)["0.0.0.0_443"]
    assert sorted(chains(listener)[:-1], key=lambda c: str(c)) == [
        ({"serverNames": ["api.example.com"]}, "outbound|443||api.example.com"),
        ({"serverNames": ["one.example.org"]}, "outbound|443||one.example.org"),
        ({"serverNames": ["two.example.org"]}, "outbound|443||two.example.org"),
    ]
    assert listener.default_filter_chain.name == "PassthroughFilterChain"


def test_tls_entry_with_a_range_and_an_address() -> None:
    entry = istio(
        "ServiceEntry",
        "mixed",
        "default",
        {
            "hosts": ["mixed.example.org"],
            "addresses": ["10.30.0.0/16", "10.40.0.7"],
            "location": "MESH_EXTERNAL",
            "resolution": "NONE",
            "ports": [{"number": 9443, "name": "tls", "protocol": "TLS"}],
        },
    )
    found = listeners(build_with(entry), **REDIRECT)
    # On the wildcard only the range and the SNI tell the service apart; its own address needs neither.
    assert chains(found["0.0.0.0_9443"]) == [
        (
            {
                "serverNames": ["mixed.example.org"],
                "prefixRanges": [{"addressPrefix": "10.30.0.0", "prefixLen": 16}],
            },
            "outbound|9443||mixed.example.org",
        ),
        ({}, "PassthroughCluster"),
    ]
    assert chains(found["10.40.0.7_9443"]) == [({}, "outbound|9443||mixed.example.org")]


def test_destination_rule_source_ip_hashing_and_connection_limits_reach_tcp_proxy() -> None:
    rule = istio(
        "DestinationRule",
        "db",
        "default",
        {
            "host": "db",
            "trafficPolicy": {
                "loadBalancer": {"consistentHash": {"useSourceIp": True}},
                "connectionPool": {"tcp": {"idleTimeout": "45s", "maxConnectionDuration": "1h"}},
            },
            "subsets": [
                {"name": "v1", "labels": {"version": "v1"}},
                {
                    "name": "v2",
                    "labels": {"version": "v2"},
                    "trafficPolicy": {"loadBalancer": {"simple": "RANDOM"}},
                },
            ],
        },
    )

    def proxy_for(subset: str) -> Any:
        route = vs(
            "db", {"hosts": ["db"], "tcp": [{"route": [{"destination": {"host": "db", "subset": subset}}]}]}
        )
        model = build([*mesh_objects(), rule, route])
        return proxy_of(listeners(model, **REDIRECT)["10.96.0.40_3306"].filter_chains[0])

    v1 = proxy_for("v1")
    assert [h.WhichOneof("policy_specifier") for h in v1.hash_policy] == ["source_ip"]
    assert (v1.idle_timeout.seconds, v1.max_downstream_connection_duration.seconds) == (45, 3600)
    # The subset's own load balancer replaces the rule's: no source-IP hashing for v2.
    assert not proxy_for("v2").hash_policy
