"""Wire encoding: both twins give the same bytes, which parse into exactly what the protobuf builders make."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import pytest
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from meshpilot.model.endpoint import Endpoint, HealthStatus, Locality
from meshpilot.networking import endpoint as builder
from meshpilot.networking import wire_py


def _compiled() -> ModuleType | None:
    try:
        return importlib.import_module("meshpilot._ext.wire")
    except ImportError:
        return None


@pytest.fixture(params=["py", "c"])
def impl(request: pytest.FixtureRequest) -> ModuleType:
    if request.param == "py":
        return wire_py
    module = _compiled()
    if module is None:
        pytest.skip("compiled extension not built")
    return module


ipv4 = st.tuples(*[st.integers(0, 255)] * 4).map(lambda t: ".".join(map(str, t)))
ipv6 = st.sampled_from(["fd00::1", "2001:db8::7", "::1"])
address = st.one_of(ipv4, ipv6, st.sampled_from(["unix:///var/run/app.sock", "db.example.com", "bad.cafe"]))
label_text = st.text("abcxyz-./", min_size=0, max_size=6)
endpoints = st.builds(
    Endpoint,
    address=address,
    port=st.integers(0, 65535),
    service_port_name=st.sampled_from(["http", "grpc", ""]),
    labels=st.dictionaries(
        st.sampled_from(["app", "version", "security.istio.io/tlsMode", "x"]), label_text, max_size=3
    ),
    tls_mode=st.sampled_from(["istio", "disabled"]),
    locality=st.builds(
        Locality,
        label=st.sampled_from(["", "us/a/", "us/b/1", "eu"]),
        cluster_id=st.sampled_from(["Kubernetes", "west"]),
    ),
    workload_name=label_text,
    namespace=label_text,
    health=st.sampled_from(list(HealthStatus)),
    weight=st.integers(0, 2**31),
    extra_addresses=st.lists(ipv6, max_size=2).map(tuple),
)
subsets = st.one_of(st.none(), st.dictionaries(st.sampled_from(["app", "version"]), label_text, max_size=2))
tls_modes = st.sampled_from([-1, 0, 1, 2, 3])


def reference(name: str, eps: list[Endpoint], port: str, subset: Any, tls_mode: int, hostnames: bool) -> Any:
    """The ClusterLoadAssignment the protobuf-object builder makes from the same inputs."""
    chosen = wire_py.select(eps, port, subset, hostnames)
    mode = None if tls_mode == -1 else tls_mode
    return builder.load_assignment(name, builder.locality_groups(chosen, tls_mode=mode))


@given(st.lists(endpoints, max_size=12), st.sampled_from(["http", "grpc"]), subsets, tls_modes, st.booleans())
@settings(max_examples=300, deadline=None)
def test_cla_bytes_parse_into_the_builders_message(
    eps: list[Endpoint], port: str, subset: Any, tls_mode: int, hostnames: bool
) -> None:
    name = "outbound|9080|v1|reviews.default.svc.cluster.local"
    expected = reference(name, eps, port, subset, tls_mode, hostnames)
    encoded = wire_py.cluster_load_assignment(name, eps, port, subset, tls_mode, hostnames)
    assert endpoint_pb2.ClusterLoadAssignment.FromString(encoded) == expected
    compiled = _compiled()
    if compiled is not None:
        assert compiled.cluster_load_assignment(name, eps, port, subset, tls_mode, hostnames) == encoded


@given(endpoints, st.booleans())
@settings(max_examples=200, deadline=None)
def test_lb_endpoint_bytes(ep: Endpoint, mtls: bool) -> None:
    from envoy.config.endpoint.v3 import endpoint_components_pb2

    encoded = wire_py.lb_endpoint(ep, mtls)
    assert endpoint_components_pb2.LbEndpoint.FromString(encoded) == builder.lb_endpoint(ep, mtls=mtls)
    compiled = _compiled()
    if compiled is not None:
        assert compiled.lb_endpoint(ep, mtls) == encoded


@given(
    st.text(max_size=30),
    st.text(max_size=60),
    st.text(max_size=40),
    st.lists(st.binary(max_size=50), max_size=5),
)
@settings(max_examples=200, deadline=None)
def test_discovery_response_and_any(version: str, type_url: str, nonce: str, values: list[bytes]) -> None:
    resources = [wire_py.any_bytes(type_url, v) for v in values]
    encoded = wire_py.discovery_response(version, type_url, nonce, resources)
    expected = discovery_pb2.DiscoveryResponse(
        version_info=version,
        type_url=type_url,
        nonce=nonce,
        resources=[any_pb2.Any(type_url=type_url, value=v) for v in values],
    )
    assert discovery_pb2.DiscoveryResponse.FromString(encoded) == expected
    compiled = _compiled()
    if compiled is not None:
        assert [compiled.any_bytes(type_url, v) for v in values] == resources
        assert compiled.discovery_response(version, type_url, nonce, resources) == encoded


def test_empty_assignment_is_only_the_name(impl: ModuleType) -> None:
    encoded = impl.cluster_load_assignment("c", [], "http", None, -1)
    assert endpoint_pb2.ClusterLoadAssignment.FromString(encoded) == endpoint_pb2.ClusterLoadAssignment(
        cluster_name="c"
    )


def test_large_messages_get_multi_byte_lengths(impl: ModuleType) -> None:
    eps = [Endpoint(f"10.{i // 256}.{i % 256}.1", 8080, "http", telemetry="w" * 200) for i in range(300)]
    encoded = impl.cluster_load_assignment("big", eps, "http", None, -1)
    parsed = endpoint_pb2.ClusterLoadAssignment.FromString(encoded)
    assert len(parsed.endpoints[0].lb_endpoints) == 300
    assert parsed.endpoints[0].load_balancing_weight.value == 300


def test_enum_strings_are_accepted(impl: ModuleType) -> None:
    from meshpilot.xds.types import TypeUrl

    assert impl.any_bytes(TypeUrl.ENDPOINT, b"x") == wire_py.any_bytes(str(TypeUrl.ENDPOINT), b"x")
