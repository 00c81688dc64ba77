"""Outbound clusters from templates parse into exactly what the protobuf-object builder makes."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from google.protobuf import any_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.kube import istio, service, workload
from support.model import build

from meshpilot.networking import extensions, wire_py
from meshpilot.networking.cluster import ClusterInputs, build_outbound_cluster, outbound_specs
from meshpilot.networking.cluster_wire import OutboundClusterEncoder

CLIENT = "sidecar~10.1.0.11~client-0.default~default.svc.cluster.local"

port_names = st.sampled_from(["http", "http2", "grpc", "tcp", "tls", "mongo", "web", "http-alt"])
tls_settings = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {"mode": st.sampled_from(["DISABLE", "ISTIO_MUTUAL", "SIMPLE"])},
        optional={
            "sni": st.sampled_from(["custom.sni", ""]),
            "subjectAltNames": st.lists(st.sampled_from(["spiffe://td/ns/a/sa/x", "y.example"]), max_size=2),
        },
    ),
)
policies = st.fixed_dictionaries(
    {},
    optional={
        "loadBalancer": st.sampled_from(
            [
                {"simple": "LEAST_REQUEST"},
                {"simple": "RANDOM"},
                {"consistentHash": {"httpHeaderName": "x-user"}},
                {"simple": "ROUND_ROBIN", "warmupDurationSecs": "10s"},
                {"warmup": {"duration": "5s", "minimumPercent": 20}},
                {"localityLbSetting": {"distribute": [{"from": "*", "to": {"r1/*": 60, "r2/*": 40}}]}},
                {"localityLbSetting": {"failover": [{"from": "r1", "to": "r2"}]}},
                {"localityLbSetting": {"enabled": False}},
            ]
        ),
        "connectionPool": st.sampled_from(
            [
                {"tcp": {"maxConnections": 7, "connectTimeout": "2s"}},
                {"http": {"http2MaxRequests": 9, "idleTimeout": "30s", "h2UpgradePolicy": "UPGRADE"}},
                {"http": {"useClientProtocol": True, "maxConcurrentStreams": 5}},
                {"tcp": {"idleTimeout": "1m", "tcpKeepalive": {"probes": 2}}},
            ]
        ),
        "outlierDetection": st.just({"consecutive5xxErrors": 3, "interval": "5s"}),
        "tls": tls_settings.filter(lambda t: t is not None),
        "proxyProtocol": st.just({"version": "V2"}),
    },
).filter(bool)  # an empty trafficPolicy is invalid


@st.composite
def meshes(draw: Any) -> tuple[list[dict[str, Any]], bool, bool]:
    docs: list[dict[str, Any]] = list(
        workload("client", "default", "10.96.0.1", 8080, {"client-0": "10.1.0.11"})
    )
    for i in range(draw(st.integers(1, 4))):
        ports = draw(st.lists(port_names, min_size=1, max_size=3, unique=True))
        ns = draw(st.sampled_from(["default", "other"]))
        svc_ports = [(name, 8000 + j) for j, name in enumerate(ports)]
        # PreferClose turns locality balancing on without a rule: a template of its own.
        close = {"trafficDistribution": "PreferClose"} if draw(st.booleans()) else {}
        docs.append(service(f"s{i}", ns, f"10.96.1.{i}", svc_ports, {"app": f"s{i}"}, **close))
        if draw(st.booleans()):
            rule: dict[str, Any] = {"host": f"s{i}.{ns}.svc.cluster.local"}
            if draw(st.booleans()):
                rule["trafficPolicy"] = draw(policies)
                if draw(st.booleans()):
                    rule["trafficPolicy"]["portLevelSettings"] = [
                        # Port-level settings have no proxyProtocol.
                        {
                            "port": {"number": 8000},
                            **draw(policies.filter(lambda p: "proxyProtocol" not in p)),
                        }
                    ]
            subsets = draw(st.lists(st.sampled_from(["v1", "v2", "v3"]), max_size=2, unique=True))
            if subsets:
                rule["subsets"] = [
                    {"name": s, "labels": {"version": s}, **({"trafficPolicy": draw(policies)} if k else {})}
                    for k, s in enumerate(subsets)
                ]
            docs.append(istio("DestinationRule", f"dr{i}", ns, rule))
    for i in range(draw(st.integers(0, 2))):
        docs.append(
            istio(
                "ServiceEntry",
                f"se{i}",
                "default",
                {
                    "hosts": [f"api{i}.example.com"],
                    "location": draw(st.sampled_from(["MESH_EXTERNAL", "MESH_INTERNAL"])),
                    "resolution": "STATIC",
                    "endpoints": [{"address": f"192.0.2.{i + 1}"}],
                    "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}],
                },
            )
        )
    return docs, draw(st.booleans()), draw(st.booleans())


@given(meshes())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_template_clusters_equal_the_builders(mesh: tuple[list[dict[str, Any]], bool, bool]) -> None:
    docs, auto_mtls, exchange = mesh
    model = build(docs, mesh_yaml=f"enableAutoMtls: {str(auto_mtls).lower()}\n")
    # Istio's proxy lists the exchange filter by its registered name; upstream Envoy lists only its own.
    reported = (
        (extensions.IstioFilter.UPSTREAM_METADATA_EXCHANGE.value, extensions.IstioFilter.ALPN.value)
        if exchange
        else ("envoy.filters.network.tcp_proxy",)
    )
    proxy = model.proxy(CLIENT, extensions=reported)
    inputs = ClusterInputs(proxy, model.push, model.index)
    encoder = OutboundClusterEncoder(inputs)
    encoded = 0
    for spec in outbound_specs(proxy):
        expected = build_outbound_cluster(inputs, spec.service, spec.port, spec.subset, spec.rule)
        payload = encoder.encode(spec)
        if payload is None:
            continue  # not a template case: the generator uses the builder
        encoded += 1
        message = any_pb2.Any.FromString(payload)
        assert message.type_url == "type.googleapis.com/envoy.config.cluster.v3.Cluster"
        assert expected is not None
        assert cluster_pb2.Cluster.FromString(message.value) == expected, spec.name
    assert encoded > 0


def test_template_is_shared_by_a_class_and_rules_split_classes() -> None:
    docs = [
        *workload("client", "default", "10.96.0.1", 8080, {"client-0": "10.1.0.11"}),
        service("a", "default", "10.96.1.1", [("http", 80)], {"app": "a"}),
        service("b", "default", "10.96.1.2", [("http", 80)], {"app": "b"}),
        istio(
            "DestinationRule",
            "b",
            "default",
            {"host": "b", "trafficPolicy": {"loadBalancer": {"simple": "RANDOM"}}},
        ),
    ]
    model = build(docs)
    proxy = model.proxy(CLIENT)
    encoder = OutboundClusterEncoder(ClusterInputs(proxy, model.push, model.index))
    by_name = {spec.name: spec for spec in outbound_specs(proxy)}
    a = cluster_pb2.Cluster.FromString(
        any_pb2.Any.FromString(
            encoder.encode(by_name["outbound|80||a.default.svc.cluster.local"]) or b""
        ).value
    )
    b = cluster_pb2.Cluster.FromString(
        any_pb2.Any.FromString(
            encoder.encode(by_name["outbound|80||b.default.svc.cluster.local"]) or b""
        ).value
    )
    assert a.lb_policy == cluster_pb2.Cluster.LEAST_REQUEST  # istiod's default
    assert b.lb_policy == cluster_pb2.Cluster.RANDOM


def test_dns_clusters_are_left_to_the_builder() -> None:
    docs = [
        *workload("client", "default", "10.96.0.1", 8080, {"client-0": "10.1.0.11"}),
        istio(
            "ServiceEntry",
            "ext",
            "default",
            {
                "hosts": ["db.example.com"],
                "resolution": "DNS",
                "ports": [{"number": 5432, "name": "tcp", "protocol": "TCP"}],
            },
        ),
    ]
    model = build(docs)
    proxy = model.proxy(CLIENT)
    encoder = OutboundClusterEncoder(ClusterInputs(proxy, model.push, model.index))
    spec = next(s for s in outbound_specs(proxy) if "db.example.com" in s.name)
    assert encoder.encode(spec) is None


metadata_args = st.tuples(
    st.text(max_size=20),
    st.text(max_size=5),
    st.text(max_size=30),
    st.text(max_size=10),
    st.text(max_size=10),
    st.booleans(),
)


@given(
    metadata_args,
    st.binary(max_size=300),
    st.text(max_size=60),
    st.sampled_from([0, 1, 2]),
    st.binary(min_size=1, max_size=200),
    st.binary(max_size=80),
    st.lists(st.text(max_size=40), max_size=4).map(tuple),
    st.text(max_size=60),
)
@settings(max_examples=300, deadline=None)
def test_compiled_cluster_bytes_equal_the_twins(
    meta: tuple[str, str, str, str, str, bool],
    template: bytes,
    name: str,
    tls: int,
    common: bytes,
    validation: bytes,
    sans: tuple[str, ...],
    sni: str,
) -> None:
    compiled = _compiled()
    if compiled is None:
        pytest.skip("compiled extension not built")
    assert compiled.cluster_metadata(*meta) == wire_py.cluster_metadata(*meta)
    metadata = wire_py.cluster_metadata(*meta)
    args = (template, name, metadata, tls, common, validation, sans, sni)
    assert compiled.outbound_cluster(*args) == wire_py.outbound_cluster(*args)


def _compiled() -> Any:
    try:
        return importlib.import_module("meshpilot._ext.wire")
    except ImportError:
        return None


def test_port_level_settings_split_classes() -> None:
    docs = [
        *workload("client", "default", "10.96.0.1", 8080, {"client-0": "10.1.0.11"}),
        service("a", "default", "10.96.1.1", [("http", 80), ("http-alt", 81)], {"app": "a"}),
        istio(
            "DestinationRule",
            "a",
            "default",
            {
                "host": "a",
                "trafficPolicy": {
                    "loadBalancer": {"simple": "RANDOM"},
                    "portLevelSettings": [
                        {"port": {"number": 81}, "loadBalancer": {"simple": "ROUND_ROBIN"}}
                    ],
                },
            },
        ),
    ]
    model = build(docs)
    proxy = model.proxy(CLIENT)
    inputs = ClusterInputs(proxy, model.push, model.index)
    encoder = OutboundClusterEncoder(inputs)
    policies = {}
    for spec in outbound_specs(proxy):
        if spec.service.name == "a":
            payload = encoder.encode(spec)
            assert payload is not None
            cluster = cluster_pb2.Cluster.FromString(any_pb2.Any.FromString(payload).value)
            assert cluster == build_outbound_cluster(inputs, spec.service, spec.port, spec.subset, spec.rule)
            policies[spec.port.port] = cluster.lb_policy
    assert policies == {80: cluster_pb2.Cluster.RANDOM, 81: cluster_pb2.Cluster.ROUND_ROBIN}


def _decoded(payload: bytes | None) -> Any:
    assert payload is not None
    return cluster_pb2.Cluster.FromString(any_pb2.Any.FromString(payload).value)


def test_a_prefer_close_service_does_not_take_another_services_template() -> None:
    # Neither has a DestinationRule; PreferClose alone turns locality-weighted balancing on.
    docs = [
        *workload("client", "default", "10.96.0.1", 8080, {"client-0": "10.1.0.11"}),
        service("a", "default", "10.96.1.1", [("http", 80)], {"app": "a"}),
        service("b", "default", "10.96.1.2", [("http", 80)], {"app": "b"}, trafficDistribution="PreferClose"),
    ]
    model = build(docs)
    proxy = model.proxy(CLIENT)
    inputs = ClusterInputs(proxy, model.push, model.index)
    encoder = OutboundClusterEncoder(inputs)
    specs = {spec.service.name: spec for spec in outbound_specs(proxy) if spec.service.name in "ab"}
    for name in ("a", "b"):  # a first: its template is made first
        spec = specs[name]
        expected = build_outbound_cluster(inputs, spec.service, spec.port, spec.subset, spec.rule)
        assert _decoded(encoder.encode(spec)) == expected, name
    assert _decoded(encoder.encode(specs["b"])).common_lb_config.HasField("locality_weighted_lb_config")


def test_rules_with_the_same_policy_share_one_template() -> None:
    policy = {"loadBalancer": {"simple": "RANDOM"}, "outlierDetection": {"consecutive5xxErrors": 3}}
    docs: list[dict[str, Any]] = list(
        workload("client", "default", "10.96.0.1", 8080, {"client-0": "10.1.0.11"})
    )
    for i in range(3):
        docs.append(service(f"s{i}", "default", f"10.96.1.{i}", [("http", 80)], {"app": f"s{i}"}))
        rule = {"host": f"s{i}", "trafficPolicy": policy, "subsets": [{"name": "v1", "labels": {"v": "1"}}]}
        docs.append(istio("DestinationRule", f"s{i}", "default", rule))
    docs.append(service("other", "default", "10.96.2.1", [("http", 80)], {"app": "other"}))
    other = {"host": "other", "trafficPolicy": {"loadBalancer": {"simple": "ROUND_ROBIN"}}}
    docs.append(istio("DestinationRule", "other", "default", other))
    model = build(docs)
    proxy = model.proxy(CLIENT)
    inputs = ClusterInputs(proxy, model.push, model.index)
    built: list[str] = []
    encoder = OutboundClusterEncoder(inputs)
    original = encoder._template

    def counting(spec: Any) -> bytes | None:
        built.append(spec.name)
        return original(spec)

    encoder._template = counting  # type: ignore[method-assign]
    for spec in outbound_specs(proxy):
        if spec.rule is not None:
            expected = build_outbound_cluster(inputs, spec.service, spec.port, spec.subset, spec.rule)
            assert _decoded(encoder.encode(spec)) == expected, spec.name
    # Three rules' clusters with and without their subset (the subset has no policy of its own: one
    # class), and the other rule's: two templates, not seven.
    assert len(built) == 2, built
