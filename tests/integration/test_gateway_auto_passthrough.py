"""A real Envoy as an east-west gateway: a Gateway server with ``tls.mode: AUTO_PASSTHROUGH`` forwards
TLS by the SNI of mesh mTLS (``outbound_.<port>_.<subset>_.<host>``) to the service's workloads without
terminating it. No VirtualService is needed: the SNI names the cluster.

The workloads are TLS servers that report the SNI they saw, standing in for the destination sidecar
that would terminate the client's mTLS. Only workloads that take Istio mTLS (the
``security.istio.io/tlsMode: istio`` label) are reachable, as istiod arranges it.
"""

from __future__ import annotations

import ssl
from typing import Any

import pytest
from integration.conftest import MeshHarness
from support.kube import endpoint_slice, istio, namespace, pod, service
from support.processes import free_port
from support.tls_backend import tls_hello
from support.wait import eventually

pytestmark = [pytest.mark.envoy, pytest.mark.integration]

GATEWAY_IP = "127.0.0.100"
MESH_IP = "127.0.0.101"
PLAINTEXT_IP = "127.0.0.102"
PORT = 8443
ISTIO_ALPN = ("istio",)
LEDGER = "ledger.default.svc.cluster.local"
PLAIN = "plain.default.svc.cluster.local"


def _service(name: str, ip: str, cluster_ip: str, labels: dict[str, str]) -> list[dict[str, Any]]:
    pod_name = f"{name}-v1"
    return [
        service(name, "default", cluster_ip, [("tls", PORT)], {"app": name}),
        pod(pod_name, "default", ip, {"app": name, "version": "v1", **labels}, service_account=name),
        endpoint_slice(f"{name}-slice", "default", name, [("tls", PORT)], [(pod_name, ip)]),
    ]


def _refused(server_name: str, port: int, alpn: tuple[str, ...] = ISTIO_ALPN) -> bool:
    try:
        return tls_hello(GATEWAY_IP, port, server_name, timeout=2.0, alpn=alpn) == ""
    except (ssl.SSLError, OSError):
        return True


def test_an_east_west_gateway_forwards_mesh_tls_by_sni_to_mtls_workloads_only(mesh: MeshHarness) -> None:
    port = free_port(GATEWAY_IP)
    mesh.write("namespaces.yaml", [namespace("default"), namespace("istio-system")])
    mesh.write(
        "services.yaml",
        [
            # An injected workload (it takes Istio mTLS) and one without a sidecar.
            *_service("ledger", MESH_IP, "10.96.0.60", {"security.istio.io/tlsMode": "istio"}),
            *_service("plain", PLAINTEXT_IP, "10.96.0.61", {}),
            istio(
                "DestinationRule",
                "ledger",
                "default",
                {"host": LEDGER, "subsets": [{"name": "v1", "labels": {"version": "v1"}}]},
            ),
        ],
    )
    mesh.write("gateway-pod.yaml", [pod("ewgw-1", "istio-system", GATEWAY_IP, {"istio": "eastwestgateway"})])
    server = {
        "port": {"number": port, "name": "tls", "protocol": "TLS"},
        "hosts": ["*.local"],
        "tls": {"mode": "AUTO_PASSTHROUGH"},
        # Bound to the gateway's own loopback address: tests listen on loopback only.
        "bind": GATEWAY_IP,
    }
    ledger = mesh.tls_backend("ledger-v1", MESH_IP, PORT, [LEDGER])
    mesh.tls_backend("plain-v1", PLAINTEXT_IP, PORT, [PLAIN])
    mesh.start_meshpilot()
    envoy = mesh.sidecar(
        "ewgw-1",
        GATEWAY_IP,
        namespace="istio-system",
        labels={"istio": "eastwestgateway"},
        node_type="router",
        # What Istio's east-west gateway chart sets; the Gateway's TLS mode alone decides.
        extra_metadata={"ROUTER_MODE": "sni-dnat"},
    )

    # Written once the gateway runs: a Gateway change alone must bring the SNI-DNAT clusters too.
    mesh.write(
        "gateway.yaml",
        [
            istio(
                "Gateway",
                "cross-network",
                "istio-system",
                {"selector": {"istio": "eastwestgateway"}, "servers": [server]},
            )
        ],
    )
    # The workload sees the client's SNI: the gateway only chose by it.
    default_sni = f"outbound_.{PORT}_._.{LEDGER}"
    hello = eventually(
        lambda: tls_hello(GATEWAY_IP, port, default_sni, alpn=ISTIO_ALPN), what="SNI-DNAT route"
    )
    assert hello == f"ledger-v1 {default_sni}"
    subset_sni = f"outbound_.{PORT}_.v1_.{LEDGER}"
    assert tls_hello(GATEWAY_IP, port, subset_sni, alpn=ISTIO_ALPN) == f"ledger-v1 {subset_sni}"
    assert ledger.server_names == [default_sni, subset_sni]

    # An SNI that names no cluster, or TLS that does not offer Istio's mTLS ALPN, gets no chain.
    assert _refused(f"outbound_.{PORT}_._.unknown.default.svc.cluster.local", port)
    assert _refused(LEDGER, port)
    assert _refused(default_sni, port, alpn=())
    # A workload without a sidecar is not an endpoint of its SNI-DNAT cluster: nothing to reach.
    assert _refused(f"outbound_.{PORT}_._.{PLAIN}", port)

    clusters = envoy.dynamic_clusters()
    assert {
        f"outbound_.{PORT}_._.{LEDGER}",
        f"outbound_.{PORT}_.v1_.{LEDGER}",
        f"outbound_.{PORT}_._.{PLAIN}",
    } <= clusters
    # The plaintext workload is an endpoint of the ordinary cluster only.
    assert envoy.endpoints(f"outbound|{PORT}||{PLAIN}") == [f"{PLAINTEXT_IP}:{PORT}"]
    assert envoy.endpoints(f"outbound_.{PORT}_._.{PLAIN}") == []
    assert envoy.endpoints(f"outbound_.{PORT}_._.{LEDGER}") == [f"{MESH_IP}:{PORT}"]
    assert envoy.rejected_updates() == {}

    # Without the Gateway, the SNI-DNAT clusters go with the listener.
    mesh.remove("gateway.yaml")
    eventually(
        lambda: not any(c.startswith("outbound_.") for c in envoy.dynamic_clusters()),
        what="SNI-DNAT clusters removed with their Gateway",
    )
    assert _refused(default_sni, port)
    assert f"outbound|{PORT}||{LEDGER}" in envoy.dynamic_clusters()
