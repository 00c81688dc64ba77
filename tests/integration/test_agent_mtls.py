"""Two workloads, each an Envoy run by ``meshpilot agent proxy sidecar`` with its own service account, against
``meshpilot discovery`` with Istio's defaults (auto mutual TLS, PERMISSIVE): the agents get their
certificates from meshpilot's CA and their config over the secure port, each with its pod's token,
which a real kube-apiserver issues (TokenRequest) and reviews (TokenReview).

The pods run without traffic capture (interception ``NONE``, as the other loopback tests): the client's
Sidecar binds its egress listener to an address of its own, the server's binds its ingress listener to
the pod IP and forwards to the app.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.agent_harness import (
    MESHPILOT_AGENT,
    MeshWorkload,
    PilotAgent,
    SecureControlPlane,
    start_workload_agent,
    wait_ready,
)
from support.kube import egress_sidecar, endpoint_slice, istio, namespace, pod, service
from support.processes import http_get
from support.real_kube import RealKubeApiServer, service_account_token
from support.wait import eventually

pytestmark = [pytest.mark.integration, pytest.mark.envoy, pytest.mark.reference, pytest.mark.timeout(300)]

CLIENT_POD_IP = "127.0.62.11"
CLIENT_EGRESS = "127.0.62.12"
SERVER_POD_IP = "127.0.62.21"
APP = ("127.0.0.1", 18062)
IN_MESH = {"security.istio.io/tlsMode": "istio"}


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealKubeApiServer]:
    with RealKubeApiServer(tmp_path_factory.mktemp("agent-mtls-kube")) as server:
        server.apply(namespace("istio-system"))
        yield server


def _config(mesh: Any) -> None:
    mesh.write(
        "apps.yaml",
        [
            service("productpage", "default", "10.96.62.10", [("http", 9080)], {"app": "productpage"}),
            pod(
                "productpage-v1",
                "default",
                CLIENT_POD_IP,
                {"app": "productpage", **IN_MESH},
                service_account="productpage",
            ),
            endpoint_slice(
                "productpage-s",
                "default",
                "productpage",
                [("http", 9080)],
                [("productpage-v1", CLIENT_POD_IP)],
            ),
            service("reviews", "default", "10.96.62.20", [("http", 9080)], {"app": "reviews"}),
            pod(
                "reviews-v1",
                "default",
                SERVER_POD_IP,
                {"app": "reviews", **IN_MESH},
                service_account="reviews",
            ),
            endpoint_slice(
                "reviews-s", "default", "reviews", [("http", 9080)], [("reviews-v1", SERVER_POD_IP)]
            ),
            egress_sidecar("productpage", CLIENT_EGRESS),
            # A connection per request, so every request is a new handshake with the client's current
            # certificate (the rotation test sees each renewal); auto mutual TLS still picks the TLS mode.
            istio(
                "DestinationRule",
                "reviews",
                "default",
                {
                    "host": "reviews",
                    "trafficPolicy": {"connectionPool": {"http": {"maxRequestsPerConnection": 1}}},
                },
            ),
            istio(
                "Sidecar",
                "reviews",
                "default",
                {
                    "workloadSelector": {"labels": {"app": "reviews"}},
                    "ingress": [
                        {
                            "port": {"number": 9080, "protocol": "HTTP", "name": "http"},
                            "bind": SERVER_POD_IP,
                            "defaultEndpoint": f"{APP[0]}:{APP[1]}",
                        }
                    ],
                    "egress": [{"bind": "127.0.62.22", "hosts": ["./*"]}],
                },
            ),
        ],
    )


def _agent(
    mesh: Any,
    kube: RealKubeApiServer,
    root_pem: bytes,
    name: str,
    ip: str,
    account: str,
    labels: dict[str, str],
    *,
    secret_ttl: str = "24h",
) -> PilotAgent:
    """``meshpilot agent proxy sidecar`` for one pod, as its istio-proxy container would run it."""
    return start_workload_agent(
        mesh,
        MESHPILOT_AGENT,
        MeshWorkload(name, ip, account, labels),
        SecureControlPlane(root_pem, service_account_token(kube, account, "default")),
        # Istio's bootstrap keeps few of Envoy's stats; the TLS handshake counters are asked for.
        proxy_config={"proxyStatsMatcher": {"inclusionSuffixes": ["ssl.handshake"]}},
        extra_env={"SECRET_TTL": secret_ttl},
    )


def _start(mesh: Any, kube: RealKubeApiServer, *, secret_ttl: str = "24h") -> tuple[PilotAgent, PilotAgent]:
    mesh.write("namespace.yaml", [namespace("default")])
    _config(mesh)
    mesh.backend("reviews-app", *APP)
    mesh.start_meshpilot(kubeconfig=kube.write_kubeconfig(mesh.tmp / "kubeconfig"))
    published = eventually(lambda: kube.get("configmaps", "default", "istio-ca-root-cert"), what="mesh root")
    root = str(published["data"]["root-cert.pem"]).encode()
    server = _agent(
        mesh, kube, root, "reviews-v1", SERVER_POD_IP, "reviews", {"app": "reviews"}, secret_ttl=secret_ttl
    )
    client = _agent(
        mesh,
        kube,
        root,
        "productpage-v1",
        CLIENT_POD_IP,
        "productpage",
        {"app": "productpage"},
        secret_ttl=secret_ttl,
    )
    for agent in (server, client):
        wait_ready(agent)
    return server, client


def _call() -> dict[str, Any]:
    status, body, _ = http_get(CLIENT_EGRESS, 9080, "/hello", {"Host": "reviews"})
    assert status == 200, body
    seen: dict[str, Any] = json.loads(body)
    return seen


def _xfcc(seen: dict[str, Any]) -> str:
    return str({k.lower(): v for k, v in seen["headers"].items()}.get("x-forwarded-client-cert", ""))


def test_traffic_between_two_agents_is_mutual_tls_with_their_own_identities(mesh, kube) -> None:
    server, client = _start(mesh, kube)
    seen = eventually(_call, timeout=20, what="a request through both agents' Envoys")
    assert seen["name"] == "reviews-app"
    # The server's Envoy saw the client's certificate, issued by meshpilot's CA for its service account.
    assert "URI=spiffe://cluster.local/ns/default/sa/productpage" in _xfcc(seen)
    server_stats = server.envoy().stats()
    assert server_stats.get(f"listener.{SERVER_POD_IP}_9080.ssl.handshake", 0) >= 1
    client_stats = client.envoy().stats()
    assert client_stats["cluster.outbound|9080||reviews.default.svc.cluster.local;.ssl.handshake"] >= 1
    # PERMISSIVE: a client outside the mesh, in plaintext, is still served.
    status, body, _ = http_get(SERVER_POD_IP, 9080, "/plain", {"Host": "reviews"})
    assert status == 200 and _xfcc(json.loads(body)) == ""
    assert server.envoy().rejected_updates() == {} and client.envoy().rejected_updates() == {}
    issued = mesh.meshpilot.metric("citadel_server_success_cert_issuance_count")
    assert issued >= 2


def test_short_lived_certificates_rotate_without_failing_a_request(mesh, kube) -> None:
    _, _client = _start(mesh, kube, secret_ttl="6s")
    eventually(_call, timeout=20, what="a request through both agents' Envoys")
    hashes: list[str] = []
    failures: list[str] = []
    # Until the client's certificate has changed twice (6 s life, renewed at half of it: ~6 s), bounded
    # generously for a loaded machine.
    deadline = time.monotonic() + 45
    while time.monotonic() < deadline and len(hashes) < 3:
        try:
            seen = _call()
        except (AssertionError, OSError) as err:
            failures.append(str(err))
            continue
        digest = next((p for p in _xfcc(seen).split(";") if p.startswith("Hash=")), "")
        if not hashes or hashes[-1] != digest:
            hashes.append(digest)
        time.sleep(0.05)
    assert failures == []
    # Every request succeeded while the client's certificate changed twice, each issued by meshpilot's CA.
    assert len(hashes) >= 3, hashes
    assert mesh.meshpilot.metric("citadel_server_success_cert_issuance_count") >= 2 + len(hashes) - 1
