"""LDS for a sidecar: per-port outbound listeners, virtual listeners, Sidecar ingress."""

from __future__ import annotations

from typing import Any

from envoy.config.core.v3 import base_pb2 as core_base
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from support.kube import istio
from support.mesh_objects import CLIENT, mesh_objects
from support.model import Model, build

from meshpilot.model.push_request import PushRequest
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.generators.base import GenerationContext
from meshpilot.xds.generators.lds import ListenerGenerator

LDS = "type.googleapis.com/envoy.config.listener.v3.Listener"


def listeners(model: Model, **meta: Any) -> dict[str, Any]:
    proxy = model.proxy(CLIENT, meta)
    ctx = GenerationContext(proxy, model.push, model.index, PushRequest(push=model.push))
    out = []
    for resource in ListenerGenerator().generate(ctx, WatchedResource(LDS), None) or []:
        listener = listener_pb2.Listener()
        resource.message().Unpack(listener)
        out.append(listener)
    names = [listener.name for listener in out]
    assert len(names) == len(set(names)), "listener names are unique"
    return {listener.name: listener for listener in out}


def hcm(chain: Any) -> Any:
    """The chain's HCM: its last filter (an inbound chain's starts with metadata exchange)."""
    out = hcm_pb2.HttpConnectionManager()
    assert chain.filters[-1].name == "envoy.filters.network.http_connection_manager"
    chain.filters[-1].typed_config.Unpack(out)
    return out


def tcp_cluster(chain: Any) -> str:
    out = tcp_proxy_pb2.TcpProxy()
    chain.filters[-1].typed_config.Unpack(out)
    return out.cluster


def test_redirect_mode_shapes(model: Model) -> None:
    all_listeners = listeners(model, INTERCEPTION_MODE="REDIRECT")
    assert {
        "virtualOutbound",
        "virtualInbound",
        "0.0.0.0_9080",
        "10.96.0.40_3306",
        "10.96.0.50_6000",
        "0.0.0.0_443",
    } <= set(all_listeners)

    http = all_listeners["0.0.0.0_9080"]
    assert http.bind_to_port.value is False
    assert [f.name for f in http.listener_filters] == ["envoy.filters.listener.http_inspector"]
    [chain] = http.filter_chains
    assert list(chain.filter_chain_match.application_protocols) == ["http/1.1", "h2c"]
    manager = hcm(chain)
    assert manager.rds.route_config_name == "9080"
    assert manager.stat_prefix == "outbound_0.0.0.0_9080;"
    # istiod's order, for an Istio proxy (the model's proxies send ISTIO_VERSION and list no extensions).
    assert [f.name for f in manager.http_filters] == [
        "istio.metadata_exchange",
        "envoy.filters.http.grpc_stats",
        "istio.alpn",
        "envoy.filters.http.fault",
        "envoy.filters.http.cors",
        "envoy.filters.http.router",
    ]
    assert http.default_filter_chain.name == "PassthroughFilterChain"
    assert tcp_cluster(http.default_filter_chain) == "PassthroughCluster"

    tcp = all_listeners["10.96.0.40_3306"]
    [chain] = tcp.filter_chains
    assert tcp_cluster(chain) == "outbound|3306||db.default.svc.cluster.local"
    assert not tcp.HasField("default_filter_chain")

    sniffed = all_listeners["10.96.0.50_6000"]
    [chain] = sniffed.filter_chains
    assert hcm(chain).rds.route_config_name == "cache.default.svc.cluster.local:6000"
    assert tcp_cluster(sniffed.default_filter_chain) == "outbound|6000||cache.default.svc.cluster.local"

    headless = [n for n in all_listeners if n.endswith("_5000")]
    assert headless == [], "a headless service without endpoints has no listeners"


def test_virtual_listeners(model: Model) -> None:
    all_listeners = listeners(model, INTERCEPTION_MODE="REDIRECT")
    outbound = all_listeners["virtualOutbound"]
    assert outbound.address.socket_address.port_value == 15001
    assert outbound.use_original_dst.value is True
    assert [c.name for c in outbound.filter_chains] == [
        "virtualOutbound-blackhole",
        "virtualOutbound-catchall-tcp",
    ]
    assert tcp_cluster(outbound.filter_chains[1]) == "PassthroughCluster"

    inbound = all_listeners["virtualInbound"]
    assert inbound.address.socket_address.port_value == 15006
    assert [f.name for f in inbound.listener_filters] == [
        "envoy.filters.listener.original_dst",
        "envoy.filters.listener.tls_inspector",
        "envoy.filters.listener.http_inspector",
    ]
    names = [c.name for c in inbound.filter_chains]
    assert names[0] == "virtualInbound-blackhole"
    assert names[1:6] == [
        "virtualInbound-catchall-http",
        "virtualInbound-catchall-http",
        "virtualInbound",
        "virtualInbound",
        "virtualInbound",
    ]
    workload = [c for c in inbound.filter_chains if c.name == "0.0.0.0_9080"]
    assert [c.filter_chain_match.transport_protocol for c in workload] == ["tls", "raw_buffer"]
    assert workload[0].HasField("transport_socket"), "the mTLS chain terminates TLS"
    route = hcm(workload[1]).route_config
    assert route.name == "inbound|9080||"
    assert route.virtual_hosts[0].routes[0].route.cluster == "inbound|9080||"


def test_registry_only_sends_unknown_traffic_to_the_black_hole() -> None:
    model = build(mesh_objects(), mesh_yaml="outboundTrafficPolicy: {mode: REGISTRY_ONLY}")
    all_listeners = listeners(model, INTERCEPTION_MODE="REDIRECT")
    assert tcp_cluster(all_listeners["virtualOutbound"].filter_chains[1]) == "BlackHoleCluster"
    assert tcp_cluster(all_listeners["0.0.0.0_9080"].default_filter_chain) == "BlackHoleCluster"


def test_none_mode_binds_on_localhost_without_virtual_listeners(model: Model) -> None:
    all_listeners = listeners(model, INTERCEPTION_MODE="NONE")
    assert "virtualOutbound" not in all_listeners and "virtualInbound" not in all_listeners
    http = all_listeners["127.0.0.1_9080"]
    assert not http.HasField("bind_to_port"), "a real bind"
    assert http.max_connections_to_accept_per_socket_event.value == 1
    [chain] = http.filter_chains
    assert not chain.filter_chain_match.application_protocols, "bound HTTP listeners need no ALPN match"
    assert hcm(chain).rds.route_config_name == "9080"


def test_sidecar_egress_bind_and_ingress_listener() -> None:
    docs = [
        *mesh_objects(),
        istio(
            "Sidecar",
            "pp",
            "default",
            {
                "workloadSelector": {"labels": {"app": "productpage"}},
                "egress": [{"bind": "127.0.0.11", "hosts": ["./*"]}],
                "ingress": [
                    {
                        "port": {"number": 9080, "protocol": "HTTP", "name": "http"},
                        "bind": "127.0.0.11",
                        "defaultEndpoint": "127.0.0.1:8080",
                    }
                ],
            },
        ),
    ]
    docs[-1]["spec"]["egress"][0]["bind"] = "127.0.1.11"
    all_listeners = listeners(build(docs), INTERCEPTION_MODE="NONE")
    outbound = sorted(n for n in all_listeners if n.startswith("127.0.1.11_"))
    # "./*" keeps only the default namespace's services (not ratings, in "other"); with an explicit bind
    # the headless service gets one listener on it, not one per endpoint.
    assert outbound == [
        "127.0.1.11_3306",
        "127.0.1.11_443",
        "127.0.1.11_5000",
        "127.0.1.11_6000",
        "127.0.1.11_9080",
    ]
    listener = all_listeners["127.0.0.11_9080"]
    assert listener.traffic_direction == core_base.INBOUND
    transports = [c.filter_chain_match.transport_protocol for c in listener.filter_chains]
    assert transports == ["tls", "raw_buffer"]
    assert (
        hcm(listener.filter_chains[1]).route_config.virtual_hosts[0].routes[0].route.cluster
        == "inbound|9080||"
    )


def test_an_outbound_listener_never_takes_the_name_of_an_ingress_listener() -> None:
    docs = [
        *mesh_objects(),
        istio(
            "Sidecar",
            "pp",
            "default",
            {
                "workloadSelector": {"labels": {"app": "productpage"}},
                "egress": [{"bind": "127.0.0.11", "hosts": ["./*"]}],
                "ingress": [
                    {
                        "port": {"number": 9080, "protocol": "HTTP", "name": "http"},
                        "bind": "127.0.0.11",
                        "defaultEndpoint": "127.0.0.1:8080",
                    }
                ],
            },
        ),
    ]
    all_listeners = listeners(build(docs), INTERCEPTION_MODE="NONE")
    assert all_listeners["127.0.0.11_9080"].traffic_direction == core_base.INBOUND
