"""PeerAuthentication in the generated config: inbound chains, gRPC servers, auto mTLS, EDS marks,
and pushes (which proxies a change concerns, and no stale cached output)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from google.protobuf import any_pb2
from support.kube import istio, service, workload
from support.model import Model, build

from meshpilot.config.decode import decode_object
from meshpilot.model.config import Config, ConfigKey
from meshpilot.model.kind import Kind
from meshpilot.model.proxy import Proxy
from meshpilot.model.push_request import PushRequest
from meshpilot.networking.cluster import ClusterInputs, build_clusters
from meshpilot.networking.endpoint import build_cluster_load_assignment, encode_cluster_load_assignment
from meshpilot.networking.listener_inbound import build_inbound_listeners
from meshpilot.xds.cache import XdsCache
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.dependencies import proxy_needs_push
from meshpilot.xds.generators import sidecar_generators
from meshpilot.xds.generators.base import GenerationContext
from meshpilot.xds.generators.grpc import GrpcListenerGenerator
from meshpilot.xds.types import TypeUrl

ISTIO = {"security.istio.io/tlsMode": "istio"}
API = "sidecar~10.1.0.51~api-0.default~default.svc.cluster.local"
CLIENT = "sidecar~10.1.0.61~client-0.other~other.svc.cluster.local"
API_HTTP = "outbound|9080||api.default.svc.cluster.local"


def objects(*policies: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        *workload("api", "default", "10.96.0.50", 9080, {"api-0": "10.1.0.51"}, labels=ISTIO),
        *workload("client", "other", "10.96.0.60", 8080, {"client-0": "10.1.0.61"}, labels=ISTIO),
        *policies,
    ]


def policy(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return istio("PeerAuthentication", name, namespace, spec, group="security")


def strict_api(**ports: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"selector": {"matchLabels": {"app": "api"}}, "mtls": {"mode": "STRICT"}}
    if ports:
        spec["portLevelMtls"] = {p.removeprefix("p"): {"mode": m} for p, m in ports.items()}
    return policy("api", "default", spec)


def virtual_inbound(model: Model, node: str = API) -> Any:
    proxy = model.proxy(node)
    return next(li for li in build_inbound_listeners(proxy, model.push) if li.name == "virtualInbound")


def chains(listener: Any, port: int | None) -> list[tuple[str, str, bool]]:
    """(name, transport, terminates mTLS) of the chains matching ``port`` (None: no port)."""
    out = []
    for chain in listener.filter_chains:
        match = chain.filter_chain_match
        has_port = match.HasField("destination_port")
        if (port is None and not has_port) or (has_port and match.destination_port.value == port):
            out.append((chain.name, match.transport_protocol, chain.HasField("transport_socket")))
    return out


def test_strict_leaves_only_mutual_tls_chains() -> None:
    listener = virtual_inbound(build(objects(strict_api())))
    assert chains(listener, 9080) == [("0.0.0.0_9080", "tls", True)]
    assert chains(listener, None) == [
        ("virtualInbound-catchall-http", "tls", True),
        ("virtualInbound", "tls", True),
    ]
    # No plaintext HTTP chain, so the HTTP inspector is not needed at all.
    assert [f.name for f in listener.listener_filters] == [
        "envoy.filters.listener.original_dst",
        "envoy.filters.listener.tls_inspector",
    ]


def test_permissive_is_the_default_chain_set() -> None:
    listener = virtual_inbound(build(objects()))
    assert chains(listener, 9080) == [("0.0.0.0_9080", "tls", True), ("0.0.0.0_9080", "raw_buffer", False)]


def test_disable_leaves_only_plaintext_and_the_tls_inspector_skips_the_port() -> None:
    listener = virtual_inbound(build(objects(strict_api(p9080="DISABLE"))))
    assert chains(listener, 9080) == [("0.0.0.0_9080", "raw_buffer", False)]
    tls = next(f for f in listener.listener_filters if f.name.endswith("tls_inspector"))
    ranges = [r.destination_port_range.start for r in tls.filter_disabled.or_match.rules]
    assert ranges == [9080, 15006]


def test_a_port_level_port_no_service_serves_gets_passthrough_chains() -> None:
    listener = virtual_inbound(build(objects(strict_api(p7000="DISABLE"))))
    assert chains(listener, 7000) == [
        ("virtualInbound-catchall-http", "raw_buffer", False),
        ("virtualInbound", "raw_buffer", False),
    ]


def test_a_namespace_policy_reaches_the_workloads_of_its_namespace_only() -> None:
    model = build(objects(policy("default", "default", {"mtls": {"mode": "STRICT"}})))
    assert chains(virtual_inbound(model), 9080) == [("0.0.0.0_9080", "tls", True)]
    assert len(chains(virtual_inbound(model, CLIENT), 8080)) == 2, "client's namespace stays PERMISSIVE"


def grpc_server_chain(model: Model) -> str:
    proxy = model.proxy(API, {"GENERATOR": "grpc"})
    ctx = GenerationContext(proxy, model.push, model.index, PushRequest(push=model.push))
    name = "xds.istio.io/grpc/lds/inbound/[::]:9080"
    watch = WatchedResource(TypeUrl.LISTENER.value, frozenset({name}))
    [resource] = GrpcListenerGenerator().generate(ctx, watch, None) or []
    listener = listener_pb2.Listener()
    assert resource.message().Unpack(listener)
    [chain] = listener.filter_chains
    return str(chain.name)


def test_proxyless_grpc_servers_take_the_mode_from_the_policy() -> None:
    assert grpc_server_chain(build(objects())) == "inbound-mtls", "PERMISSIVE with the tlsMode label"
    assert grpc_server_chain(build(objects(strict_api(p9080="DISABLE")))) == "inbound-plaintext"
    assert grpc_server_chain(build(objects(strict_api()))) == "inbound-mtls"


def client_clusters(model: Model) -> dict[str, Any]:
    proxy = model.proxy(CLIENT)
    return {c.name: c for c in build_clusters(ClusterInputs(proxy, model.push, model.index))}


def test_clients_call_a_disabled_namespace_in_plaintext() -> None:
    model = build(objects(policy("default", "default", {"mtls": {"mode": "DISABLE"}})))
    api = client_clusters(model)[API_HTTP]
    assert not api.transport_socket_matches and not api.HasField("transport_socket")
    # A workload policy does not change what clients assume of the service (istiod's best effort).
    model = build(objects(strict_api(p9080="DISABLE")))
    assert [m.name for m in client_clusters(model)[API_HTTP].transport_socket_matches] == [
        "tlsMode-istio",
        "tlsMode-disabled",
    ]


def test_headless_services_get_mtls_only_when_every_endpoint_has_a_sidecar() -> None:
    def headless(labels: dict[str, str]) -> Any:
        docs = objects()
        docs += workload("db", "default", "None", 5432, {"db-0": "10.1.0.81"}, labels=labels, port_name="tcp")
        docs[-3] = service("db", "default", "None", [("tcp", 5432)], {"app": "db", **labels})
        return client_clusters(build(docs))["outbound|5432||db.default.svc.cluster.local"]

    assert headless(ISTIO).HasField("transport_socket")
    assert not headless({}).HasField("transport_socket")


def marked(model: Model, name: str = API_HTTP) -> list[bool]:
    proxy = model.proxy(CLIENT)
    built = build_cluster_load_assignment(name, proxy, model.push, model.index)
    encoded = endpoint_pb2.ClusterLoadAssignment.FromString(
        encode_cluster_load_assignment(name, proxy, model.push, model.index)
    )
    assert encoded == built, "the encoder and the reference builder agree"
    return [
        "envoy.transport_socket_match" in lb.metadata.filter_metadata
        for group in built.endpoints
        for lb in group.lb_endpoints
    ]


def test_endpoints_of_a_disabled_port_carry_no_tls_mode_mark() -> None:
    assert marked(build(objects())) == [True]
    assert marked(build(objects(strict_api(p9080="DISABLE")))) == [False]
    assert marked(build(objects(strict_api(p5432="DISABLE")))) == [True], "another port"
    assert marked(build(objects(policy("default", "default", {"mtls": {"mode": "DISABLE"}})))) == [False]


def test_a_change_concerns_proxies_of_its_namespace_and_those_calling_into_it() -> None:
    model = build(objects())
    client = model.proxy(CLIENT)
    request = PushRequest(
        full=True, configs_updated=frozenset({ConfigKey(Kind.PEER_AUTHENTICATION, "x", "default")})
    )
    assert proxy_needs_push(client, request, "istio-system"), "client imports api.default"
    elsewhere = PushRequest(
        full=True, configs_updated=frozenset({ConfigKey(Kind.PEER_AUTHENTICATION, "x", "nowhere")})
    )
    assert not proxy_needs_push(client, elsewhere, "istio-system")
    root = PushRequest(
        full=True, configs_updated=frozenset({ConfigKey(Kind.PEER_AUTHENTICATION, "x", "istio-system")})
    )
    assert proxy_needs_push(client, root, "istio-system")


def _generate(model: Model, proxy: Proxy, cache: XdsCache, type_url: TypeUrl, names: frozenset[str]) -> Any:
    generator = sidecar_generators()[type_url]
    request = PushRequest(full=True, forced=True, reasons=Counter(), push=model.push)
    ctx = GenerationContext(proxy, model.push, model.index, request, cache=cache)
    watch = WatchedResource(type_url.value, names, wildcard=not names)
    return {r.name: r.payload for r in generator.generate(ctx, watch, None) or []}


def test_a_policy_change_is_not_served_from_cached_or_remembered_output() -> None:
    model = build(objects())
    cache = XdsCache()

    def snapshot() -> tuple[Any, Any, Any]:
        server, client = model.proxy(API), model.proxy(CLIENT)
        return (
            _generate(model, server, cache, TypeUrl.LISTENER, frozenset()),
            _generate(model, client, cache, TypeUrl.CLUSTER, frozenset()),
            _generate(model, client, cache, TypeUrl.ENDPOINT, frozenset({API_HTTP})),
        )

    before = snapshot()
    assert snapshot() == before, "same inputs, same output"
    for doc in (strict_api(p9080="DISABLE"), policy("default", "default", {"mtls": {"mode": "DISABLE"}})):
        decoded = decode_object(doc).obj
        assert isinstance(decoded, Config)
        model.env.store.upsert(decoded)
    # The lasting memo (inbound listeners) and the XdsCache are kept, as the server keeps them.
    model.push = model.env.build_push_context("test/2")
    listeners, clusters, endpoints = snapshot()
    assert listeners["virtualInbound"] != before[0]["virtualInbound"]
    assert clusters[API_HTTP] != before[1][API_HTTP]
    assert endpoints[API_HTTP] != before[2][API_HTTP]
    cluster = cluster_pb2.Cluster()
    assert _unpack(clusters[API_HTTP], cluster)
    assert not cluster.transport_socket_matches


def _unpack(payload: bytes, message: Any) -> bool:
    return bool(any_pb2.Any.FromString(payload).Unpack(message))
