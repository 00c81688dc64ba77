"""PeerAuthentication through real Envoys on loopback: a mesh client (a sidecar with a workload
certificate from SDS) and a plaintext client (a bare HTTP request) calling a server sidecar.

The server sidecar binds its Sidecar ingress ports to its pod address (no capture), so the plaintext
client reaches the server's inbound listener exactly as a pod without a sidecar would.
"""

from __future__ import annotations

import http.client
import json
from typing import Any

import pytest
from support.kube import egress_sidecar, endpoint_slice, istio, pod, service
from support.processes import http_get
from support.wait import eventually

pytestmark = [pytest.mark.envoy, pytest.mark.integration]

CLIENT_POD_IP = "127.0.0.12"
CLIENT_EGRESS = "127.0.1.12"
SERVER_POD_IP = "127.0.0.22"
#: The server's two ports (HTTP both) and the apps behind them.
MAIN, SIDE = 9080, 9081
APPS = {MAIN: ("127.0.0.1", 18031), SIDE: ("127.0.0.1", 18032)}


def config(mesh: Any) -> None:
    ports = [("http", MAIN), ("http-side", SIDE)]
    mesh.write(
        "apps.yaml",
        [
            service("productpage", "default", "10.96.0.10", [("http", 9080)], {"app": "productpage"}),
            pod(
                "productpage-v1",
                "default",
                CLIENT_POD_IP,
                {"app": "productpage"},
                service_account="productpage",
            ),
            endpoint_slice(
                "productpage-s",
                "default",
                "productpage",
                [("http", 9080)],
                [("productpage-v1", CLIENT_POD_IP)],
            ),
            service("reviews", "default", "10.96.0.20", ports, {"app": "reviews"}),
            pod(
                "reviews-v1",
                "default",
                SERVER_POD_IP,
                {"app": "reviews", "security.istio.io/tlsMode": "istio"},
                service_account="reviews",
            ),
            endpoint_slice("reviews-s", "default", "reviews", ports, [("reviews-v1", SERVER_POD_IP)]),
            egress_sidecar("productpage", CLIENT_EGRESS),
            istio(
                "Sidecar",
                "reviews",
                "default",
                {
                    "workloadSelector": {"labels": {"app": "reviews"}},
                    "ingress": [
                        {
                            "port": {"number": port, "protocol": "HTTP", "name": f"http-{port}"},
                            "bind": SERVER_POD_IP,
                            "defaultEndpoint": f"{host}:{app_port}",
                        }
                        for port, (host, app_port) in APPS.items()
                    ],
                    "egress": [{"bind": "127.0.1.22", "hosts": ["./*"]}],
                },
            ),
        ],
    )


def policy(spec: dict[str, Any] | None) -> list[dict[str, Any]]:
    if spec is None:
        return []
    return [istio("PeerAuthentication", "reviews", "default", spec, group="security")]


STRICT = {"selector": {"matchLabels": {"app": "reviews"}}, "mtls": {"mode": "STRICT"}}
STRICT_BUT_SIDE = {**STRICT, "portLevelMtls": {str(SIDE): {"mode": "DISABLE"}}}


def mesh_call(port: int) -> dict[str, Any]:
    """Through the client sidecar, which chooses mutual TLS as auto mTLS tells it."""
    status, body, _ = http_get(CLIENT_EGRESS, port, "/hello", {"Host": "reviews"})
    assert status == 200, body
    return json.loads(body)  # type: ignore[no-any-return]


def plaintext_call(port: int) -> int | str:
    """Straight to the server sidecar, no certificate: a status, or how the connection failed."""
    try:
        status, _, _ = http_get(SERVER_POD_IP, port, "/hello", {"Host": "reviews"}, timeout=3)
    except (ConnectionError, http.client.HTTPException, TimeoutError, OSError) as err:
        return type(err).__name__
    return status


def refused(port: int) -> bool:
    outcome = plaintext_call(port)
    assert not isinstance(outcome, int), f"plaintext to {port} was answered {outcome}"
    return True


def served(port: int) -> bool:
    assert plaintext_call(port) == 200
    return True


def start(mesh: Any, spec: dict[str, Any] | None) -> tuple[Any, Any]:
    config(mesh)
    mesh.write("policy.yaml", policy(spec))
    for port, (host, app_port) in APPS.items():
        mesh.backend(f"reviews-{port}", host, app_port)
    mesh.start_meshpilot()
    server = mesh.sidecar("reviews-v1", SERVER_POD_IP, labels={"app": "reviews"}, service_account="reviews")
    client = mesh.sidecar(
        "productpage-v1", CLIENT_POD_IP, labels={"app": "productpage"}, service_account="pp"
    )
    return server, client


def handshakes(server: Any, port: int) -> int:
    return int(server.stats().get(f"listener.{SERVER_POD_IP}_{port}.ssl.handshake", 0))


def test_permissive_serves_both_then_strict_refuses_plaintext(mesh: Any) -> None:
    server, client = start(mesh, None)
    seen = eventually(lambda: mesh_call(MAIN), timeout=15, what="a mesh call")
    assert seen["name"] == f"reviews-{MAIN}"
    assert handshakes(server, MAIN) >= 1, "the mesh client used mutual TLS"
    eventually(lambda: served(MAIN), timeout=10, what="a plaintext call under PERMISSIVE")
    # A STRICT policy arrives while both Envoys run: pushed, plaintext is refused from then on.
    mesh.write("policy.yaml", policy(STRICT))
    eventually(lambda: refused(MAIN), timeout=15, what="plaintext refused under STRICT")
    xfcc = {k.lower(): v for k, v in mesh_call(MAIN)["headers"].items()}["x-forwarded-client-cert"]
    assert "URI=spiffe://cluster.local/ns/default/sa/pp" in xfcc
    # Each port has a listener of its own here (no capture), and Envoy swaps them one at a time.
    eventually(lambda: refused(SIDE), timeout=15, what="plaintext to the other port refused under STRICT")
    assert server.rejected_updates() == {} and client.rejected_updates() == {}


def test_strict_from_the_start_with_a_port_level_disable(mesh: Any) -> None:
    server, client = start(mesh, STRICT_BUT_SIDE)
    eventually(lambda: mesh_call(MAIN), timeout=15, what="a mesh call under STRICT")
    refused(MAIN)
    # The DISABLE port serves plaintext, and the mesh client calls it in plaintext too (EDS leaves
    # its endpoint unmarked, so auto mTLS does not pick TLS).
    served(SIDE)
    before = handshakes(server, SIDE)
    assert mesh_call(SIDE)["name"] == f"reviews-{SIDE}"
    assert handshakes(server, SIDE) == before == 0
    assert server.rejected_updates() == {} and client.rejected_updates() == {}
