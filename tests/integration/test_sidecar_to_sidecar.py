"""Two sidecars on loopback: client egress → server ingress listener → app, with and without mutual TLS."""

from __future__ import annotations

import json

import pytest
from support.kube import egress_sidecar, endpoint_slice, istio, pod, service
from support.processes import http_get
from support.wait import eventually

pytestmark = [pytest.mark.envoy, pytest.mark.integration]

CLIENT_POD_IP = "127.0.0.11"
CLIENT_EGRESS = "127.0.1.11"
SERVER_POD_IP = "127.0.0.21"
APP = ("127.0.0.1", 18021)


def config(mesh, *, server_in_mesh: bool) -> None:
    server_labels = {"app": "reviews"}
    if server_in_mesh:
        # What injection adds: peers may use mutual TLS with this pod.
        server_labels["security.istio.io/tlsMode"] = "istio"
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
            service("reviews", "default", "10.96.0.20", [("http", 9080)], {"app": "reviews"}),
            pod("reviews-v1", "default", SERVER_POD_IP, server_labels, service_account="reviews"),
            endpoint_slice(
                "reviews-s", "default", "reviews", [("http", 9080)], [("reviews-v1", SERVER_POD_IP)]
            ),
            egress_sidecar("productpage", CLIENT_EGRESS),
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
                    "egress": [{"bind": "127.0.1.21", "hosts": ["./*"]}],
                },
            ),
        ],
    )


def call() -> dict:  # type: ignore[type-arg]
    status, body, _ = http_get(CLIENT_EGRESS, 9080, "/hello", {"Host": "reviews"})
    assert status == 200, body
    return json.loads(body)  # type: ignore[no-any-return]


@pytest.mark.parametrize("server_in_mesh", [False, True], ids=["plaintext", "mutual-tls"])
def test_request_crosses_both_sidecars(mesh, server_in_mesh):
    config(mesh, server_in_mesh=server_in_mesh)
    app = mesh.backend("reviews-app", *APP)
    mesh.start_meshpilot()
    server = mesh.sidecar("reviews-v1", SERVER_POD_IP, labels={"app": "reviews"}, service_account="reviews")
    client = mesh.sidecar(
        "productpage-v1", CLIENT_POD_IP, labels={"app": "productpage"}, service_account="productpage"
    )
    seen = eventually(call, timeout=15, what="a request through both sidecars")
    assert seen["name"] == "reviews-app"
    assert seen["path"] == "/hello"
    assert len(app.requests) >= 1
    stats = server.stats()
    tls_handshakes = stats.get("listener.127.0.0.21_9080.ssl.handshake", 0)
    xfcc = {k.lower(): v for k, v in seen["headers"].items()}.get("x-forwarded-client-cert", "")
    if server_in_mesh:
        assert tls_handshakes >= 1, "the server sidecar terminated mutual TLS"
        # The server sidecar saw the client's workload certificate.
        assert "URI=spiffe://cluster.local/ns/default/sa/productpage" in xfcc
        # The cluster's stats use its alt_stat_name, istiod's "<name>;".
        assert client.stats()["cluster.outbound|9080||reviews.default.svc.cluster.local;.ssl.handshake"] >= 1
    else:
        assert tls_handshakes == 0
        assert xfcc == ""
    assert server.rejected_updates() == {} and client.rejected_updates() == {}
