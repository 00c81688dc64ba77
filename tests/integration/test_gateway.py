"""A real Envoy as an ingress gateway (``router``) routing real HTTP as its Gateway and VirtualService say."""

from __future__ import annotations

import json
import socket
import ssl
from typing import Any

import pytest
from integration.conftest import MeshHarness
from support.kube import istio, namespace, pod, workload
from support.processes import Envoy, free_port, http_get
from support.tls_backend import tls_hello
from support.wait import eventually

pytestmark = [pytest.mark.envoy, pytest.mark.integration]

GATEWAY_IP = "127.0.0.80"


def _gateway(port: int, hosts: list[str]) -> dict[str, Any]:
    return istio(
        "Gateway",
        "bookinfo-gateway",
        "default",
        {
            "selector": {"istio": "ingressgateway"},
            # Bound to the gateway's own loopback address: tests listen on loopback only.
            "servers": [
                {
                    "port": {"number": port, "name": "http", "protocol": "HTTP"},
                    "hosts": hosts,
                    "bind": GATEWAY_IP,
                }
            ],
        },
    )


def _virtual_service(default_host: str) -> dict[str, Any]:
    return istio(
        "VirtualService",
        "bookinfo",
        "default",
        {
            "hosts": ["bookinfo.example.com", "shop.example.com"],
            "gateways": ["bookinfo-gateway"],
            "http": [
                {"match": [{"uri": {"prefix": "/reviews"}}], "route": [{"destination": {"host": "reviews"}}]},
                {"route": [{"destination": {"host": default_host}}]},
            ],
        },
    )


def _call(port: int, host: str, path: str = "/") -> tuple[int, str]:
    status, body, _ = http_get(GATEWAY_IP, port, path, {"Host": host})
    return status, str(json.loads(body)["name"]) if status == 200 else body.decode(errors="replace")


def _listening(port: int) -> bool:
    try:
        http_get(GATEWAY_IP, port, "/", {"Host": "bookinfo.example.com"}, timeout=1.0)
    except ConnectionRefusedError:
        return False
    return True


@pytest.fixture
def gateway(mesh: MeshHarness) -> tuple[Envoy, int]:
    port = free_port(GATEWAY_IP)
    mesh.write("namespaces.yaml", [namespace("default"), namespace("istio-system")])
    mesh.write(
        "reviews.yaml", workload("reviews", "default", "10.96.0.20", 9080, {"reviews-v1": "127.0.0.81"})
    )
    mesh.write(
        "productpage.yaml",
        workload("productpage", "default", "10.96.0.10", 9080, {"productpage-v1": "127.0.0.82"}),
    )
    mesh.write("gateway-pod.yaml", [pod("gw-1", "istio-system", GATEWAY_IP, {"istio": "ingressgateway"})])
    mesh.write("gateway.yaml", [_gateway(port, ["bookinfo.example.com"])])
    mesh.write("routes.yaml", [_virtual_service("productpage")])
    mesh.backend("reviews-v1", "127.0.0.81", 9080)
    mesh.backend("productpage-v1", "127.0.0.82", 9080)
    mesh.start_meshpilot()
    envoy = mesh.sidecar(
        "gw-1", GATEWAY_IP, namespace="istio-system", labels={"istio": "ingressgateway"}, node_type="router"
    )
    return envoy, port


def test_the_gateway_routes_its_hosts_by_the_bound_virtual_service(
    mesh: MeshHarness, gateway: tuple[Envoy, int]
) -> None:
    envoy, port = gateway
    eventually(
        lambda: _call(port, "bookinfo.example.com") == (200, "productpage-v1"), what="gateway listener up"
    )
    assert _call(port, "bookinfo.example.com", "/reviews/1") == (200, "reviews-v1")
    # The VirtualService names shop.example.com too, but no server of the Gateway does.
    assert _call(port, "shop.example.com")[0] == 404
    assert envoy.rejected_updates() == {}
    clusters = envoy.dynamic_clusters()
    assert {
        "outbound|9080||reviews.default.svc.cluster.local",
        "outbound|9080||productpage.default.svc.cluster.local",
        "BlackHoleCluster",
    } <= clusters
    assert "PassthroughCluster" not in clusters
    assert not any(c.startswith("inbound|") for c in clusters)


def test_virtual_service_and_gateway_changes_reach_the_gateway(
    mesh: MeshHarness, gateway: tuple[Envoy, int]
) -> None:
    envoy, port = gateway
    eventually(
        lambda: _call(port, "bookinfo.example.com") == (200, "productpage-v1"), what="gateway listener up"
    )
    mesh.write("routes.yaml", [_virtual_service("reviews")])
    eventually(
        lambda: _call(port, "bookinfo.example.com") == (200, "reviews-v1"), what="VirtualService change"
    )
    mesh.write("gateway.yaml", [_gateway(port, ["bookinfo.example.com", "shop.example.com"])])
    eventually(lambda: _call(port, "shop.example.com") == (200, "reviews-v1"), what="Gateway change")
    mesh.remove("gateway.yaml")
    eventually(lambda: not _listening(port), what="the listener removed with its Gateway")
    assert envoy.rejected_updates() == {}


def test_tls_passthrough_by_sni_and_tcp_by_port(mesh: MeshHarness) -> None:
    tls_port, tcp_port = free_port(GATEWAY_IP), free_port(GATEWAY_IP)
    mesh.write("namespaces.yaml", [namespace("default"), namespace("istio-system")])
    mesh.write(
        "services.yaml",
        [
            *workload("secure", "default", "10.96.0.30", 8443, {"secure-v1": "127.0.0.83"}, port_name="tls"),
            *workload("db", "default", "10.96.0.40", 3306, {"db-0": "127.0.0.84"}, port_name="tcp"),
        ],
    )
    mesh.write("gateway-pod.yaml", [pod("gw-1", "istio-system", GATEWAY_IP, {"istio": "ingressgateway"})])
    servers = [
        {
            "port": {"number": tls_port, "name": "tls", "protocol": "TLS"},
            "hosts": ["*.secure.example.com"],
            "tls": {"mode": "PASSTHROUGH"},
            "bind": GATEWAY_IP,
        },
        {"port": {"number": tcp_port, "name": "tcp", "protocol": "TCP"}, "hosts": ["*"], "bind": GATEWAY_IP},
    ]
    gateway = istio("Gateway", "l4", "default", {"selector": {"istio": "ingressgateway"}, "servers": servers})
    routes = istio(
        "VirtualService",
        "l4",
        "default",
        {
            "hosts": ["*.secure.example.com", "db.default.svc.cluster.local"],
            "gateways": ["l4"],
            "tls": [
                {
                    "match": [{"port": tls_port, "sniHosts": ["shop.secure.example.com"]}],
                    "route": [{"destination": {"host": "secure"}}],
                }
            ],
            "tcp": [{"match": [{"port": tcp_port}], "route": [{"destination": {"host": "db"}}]}],
        },
    )
    mesh.write("gateway.yaml", [gateway, routes])
    mesh.tls_backend("secure-v1", "127.0.0.83", 8443, ["shop.secure.example.com"])
    mesh.tcp_backend("db-0", "127.0.0.84", 3306)
    mesh.start_meshpilot()
    envoy = mesh.sidecar(
        "gw-1", GATEWAY_IP, namespace="istio-system", labels={"istio": "ingressgateway"}, node_type="router"
    )

    # The backend terminates TLS itself and sees the client's SNI: the gateway only chose by it.
    hello = eventually(lambda: tls_hello(GATEWAY_IP, tls_port, "shop.secure.example.com"), what="TLS route")
    assert hello == "secure-v1 shop.secure.example.com"
    with pytest.raises((ssl.SSLError, OSError)):
        tls_hello(GATEWAY_IP, tls_port, "other.secure.example.com", timeout=2.0)

    def tcp_first_line() -> str:
        with socket.create_connection((GATEWAY_IP, tcp_port), timeout=5) as conn:
            return conn.recv(64).decode().strip()

    assert eventually(tcp_first_line, what="TCP route") == "db-0"
    assert envoy.rejected_updates() == {}
