"""DestinationRule SIMPLE and MUTUAL TLS: a real Envoy originates TLS to an HTTPS backend.

The certificates a rule names by file reach Envoy over the agent's SDS
(``file-root:``, ``file-cert:``), as pilot-agent serves them.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.kube import egress_sidecar, istio, namespace, workload
from support.processes import backend_name
from support.wait import eventually

pytestmark = [pytest.mark.envoy, pytest.mark.integration]

CLIENT_IP = "127.0.4.11"
SERVER_IP = "127.0.4.41"
SERVER_SAN = "spiffe://cluster.local/ns/default/sa/secure"


def write_mesh(mesh, tls: dict[str, Any]) -> None:
    mesh.write("namespace.yaml", [namespace("default")])
    mesh.write(
        "productpage.yaml",
        workload("productpage", "default", "10.96.0.10", 9080, {"productpage-v1": CLIENT_IP}),
    )
    mesh.write("secure.yaml", workload("secure", "default", "10.96.0.40", 9080, {"secure-v1": SERVER_IP}))
    mesh.write(
        "sidecar.yaml",
        [egress_sidecar("productpage", CLIENT_IP)],
    )
    write_rule(mesh, tls)


def write_rule(mesh, tls: dict[str, Any]) -> None:
    mesh.write(
        "secure-dr.yaml",
        [istio("DestinationRule", "secure", "default", {"host": "secure", "trafficPolicy": {"tls": tls}})],
    )


def call() -> tuple[int, str]:
    return backend_name(CLIENT_IP, "secure")


def test_simple_tls_checks_the_server_and_its_names(mesh, ca, tmp_path):
    server = ca.issue(SERVER_SAN, tmp_path / "server-certs")
    write_mesh(
        mesh, {"mode": "SIMPLE", "caCertificates": str(server.root_cert), "subjectAltNames": [SERVER_SAN]}
    )
    mesh.backend("secure-v1", SERVER_IP, 9080, tls=(server.cert_chain, server.key))
    mesh.start_meshpilot()
    client = mesh.sidecar(
        "productpage-v1", CLIENT_IP, labels={"app": "productpage"}, service_account="productpage"
    )
    # The backend speaks only TLS: a 200 means the sidecar originated it and trusted the server.
    eventually(lambda: call() == (200, "secure-v1"), timeout=20, what="a call through TLS origination")
    assert client.rejected_updates() == {}
    write_rule(
        mesh,
        {
            "mode": "SIMPLE",
            "caCertificates": str(server.root_cert),
            "subjectAltNames": ["spiffe://elsewhere"],
        },
    )
    eventually(lambda: call()[0] == 503, timeout=20, what="a server whose name does not match refused")


def test_mutual_tls_presents_the_rule_client_certificate(mesh, ca, tmp_path):
    server = ca.issue(SERVER_SAN, tmp_path / "server-certs")
    client_cert = ca.issue("spiffe://cluster.local/ns/default/sa/productpage", tmp_path / "client-certs")
    write_mesh(
        mesh,
        {
            "mode": "MUTUAL",
            "clientCertificate": str(client_cert.cert_chain),
            "privateKey": str(client_cert.key),
            "caCertificates": str(server.root_cert),
            "subjectAltNames": [SERVER_SAN],
        },
    )
    mesh.backend(
        "secure-v1", SERVER_IP, 9080, tls=(server.cert_chain, server.key), client_ca=server.root_cert
    )
    mesh.start_meshpilot()
    client = mesh.sidecar(
        "productpage-v1", CLIENT_IP, labels={"app": "productpage"}, service_account="productpage"
    )
    eventually(lambda: call() == (200, "secure-v1"), timeout=20, what="a call through mutual TLS origination")
    assert client.rejected_updates() == {}
    # SIMPLE presents no certificate: the backend that requires one refuses.
    write_rule(
        mesh, {"mode": "SIMPLE", "caCertificates": str(server.root_cert), "subjectAltNames": [SERVER_SAN]}
    )
    eventually(lambda: call()[0] == 503, timeout=20, what="no client certificate, no connection")
