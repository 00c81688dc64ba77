"""Gateway servers that terminate TLS: chains by SNI, contexts with certificates over SDS, and what is
not served is counted by Gateway, never served in plaintext."""

from __future__ import annotations

from typing import Any

from envoy.extensions.transport_sockets.tls.v3 import tls_pb2
from support.kube import istio, pod
from support.model import build

from meshpilot.networking.gateway import gateway_listeners, gateway_route_configuration
from meshpilot.networking.policy_problems import PROBLEMS

GATEWAY = "router~10.1.0.100~gw-1.istio-system~istio-system.svc.cluster.local"
LABELS = {"LABELS": {"istio": "ingressgateway"}}


def _objects(*servers: dict[str, Any], name: str = "tls-gw") -> list[Any]:
    return [
        pod("gw-1", "istio-system", "10.1.0.100", {"istio": "ingressgateway"}),
        istio(
            "Gateway",
            name,
            "istio-system",
            {"selector": {"istio": "ingressgateway"}, "servers": list(servers)},
        ),
        istio(
            "VirtualService",
            "vs",
            "istio-system",
            {
                "hosts": ["a.example.com"],
                "gateways": [name],
                "http": [{"route": [{"destination": {"host": "a.example.com"}}]}],
            },
        ),
    ]


def _context(chain: Any) -> Any:
    out = tls_pb2.DownstreamTlsContext()
    chain.transport_socket.typed_config.Unpack(out)
    return out


def test_mutual_with_a_credential_asks_ads_for_the_secret_and_its_ca() -> None:
    model = build(
        _objects(
            {
                "port": {"number": 443, "name": "https", "protocol": "HTTPS"},
                "hosts": ["a.example.com"],
                "tls": {"mode": "MUTUAL", "credentialName": "a-cert"},
            },
            {
                "port": {"number": 443, "name": "https-b", "protocol": "HTTPS"},
                "hosts": ["b.example.com"],
                "tls": {"mode": "SIMPLE", "credentialName": "b-cert"},
            },
        )
    )
    proxy = model.proxy(GATEWAY, LABELS)
    [listener] = gateway_listeners(proxy, model.push)
    assert [f.name for f in listener.listener_filters] == ["envoy.filters.listener.tls_inspector"]
    mutual, simple = listener.filter_chains
    assert list(mutual.filter_chain_match.server_names) == ["a.example.com"]
    context = _context(mutual)
    assert context.require_client_certificate.value is True
    common = context.common_tls_context
    assert [s.name for s in common.tls_certificate_sds_secret_configs] == ["kubernetes://a-cert"]
    assert common.tls_certificate_sds_secret_configs[0].sds_config.HasField("ads")
    validation = common.combined_validation_context.validation_context_sds_secret_config
    assert validation.name == "kubernetes://a-cert-cacert"
    assert list(common.alpn_protocols) == ["h2", "http/1.1"]
    assert _context(simple).require_client_certificate.value is False
    assert not _context(simple).common_tls_context.HasField("combined_validation_context")
    route = gateway_route_configuration(proxy, model.push, "https.443.https.tls-gw.istio-system")
    assert [v.name for v in route.virtual_hosts] == ["a.example.com:443"]


def test_a_repeated_sni_host_is_counted_not_served() -> None:
    before = PROBLEMS.count("Gateway", "istio-system/dup-gw")
    model = build(
        _objects(
            {
                "port": {"number": 443, "name": "https", "protocol": "HTTPS"},
                "hosts": ["a.example.com"],
                "tls": {"mode": "SIMPLE", "credentialName": "a-cert"},
            },
            {
                "port": {"number": 443, "name": "https-again", "protocol": "HTTPS"},
                "hosts": ["a.example.com"],
                "tls": {"mode": "SIMPLE", "credentialName": "other"},
            },
            name="dup-gw",
        )
    )
    proxy = model.proxy(GATEWAY, LABELS)
    listeners = gateway_listeners(proxy, model.push)
    assert [li.name for li in listeners] == ["0.0.0.0_443"]
    assert len(listeners[0].filter_chains) == 1
    assert PROBLEMS.count("Gateway", "istio-system/dup-gw") == before + 1
