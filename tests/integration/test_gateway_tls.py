"""A real Envoy gateway terminating HTTPS with certificates from Secrets served over SDS by meshpilot.

The gateway connects to meshpilot's secure port with a client certificate of the mesh (its verified
identity, ``istio-system/istio-ingressgateway``), as Istio's agent would connect it, and asks for the
Secrets its listeners name (``kubernetes://<name>``) on the same ADS stream. The Secrets are files
of the config directory; rewriting one reaches the gateway without a restart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from integration.conftest import MeshHarness
from support.ads_client import AdsClient, Secure
from support.gateway_tls import REFUSED, attempt, certificate, https_get, pem_key, tls_secret, write_pair
from support.kube import istio, namespace, pod, workload
from support.processes import Envoy, Meshpilot, Sds, free_port, sidecar_bootstrap
from support.wait import eventually

from meshpilot.ca.authority import CertificateAuthority
from meshpilot.ca.keys import load_plugged

pytestmark = [pytest.mark.envoy, pytest.mark.integration]

GATEWAY_IP = "127.0.0.90"
IDENTITY = "spiffe://cluster.local/ns/istio-system/sa/istio-ingressgateway"


def _gateway(simple_port: int, mutual_port: int) -> dict[str, Any]:
    return istio(
        "Gateway",
        "secure",
        "istio-system",
        {
            "selector": {"istio": "ingressgateway"},
            "servers": [
                {
                    "port": {"number": simple_port, "name": "https", "protocol": "HTTPS"},
                    "hosts": ["bookinfo.example.com"],
                    "bind": GATEWAY_IP,
                    "tls": {"mode": "SIMPLE", "credentialName": "bookinfo-cert"},
                },
                {
                    "port": {"number": mutual_port, "name": "https-mutual", "protocol": "HTTPS"},
                    "hosts": ["secure.example.com"],
                    "bind": GATEWAY_IP,
                    "tls": {"mode": "MUTUAL", "credentialName": "secure-cert"},
                },
            ],
        },
    )


def _routes() -> dict[str, Any]:
    return istio(
        "VirtualService",
        "bookinfo",
        "istio-system",
        {
            "hosts": ["bookinfo.example.com", "secure.example.com"],
            "gateways": ["secure"],
            "http": [{"route": [{"destination": {"host": "productpage.default.svc.cluster.local"}}]}],
        },
    )


def _mesh_client_certificate(mp: Meshpilot, directory: Path) -> tuple[Path, Path, Path]:
    """A certificate of the gateway's identity from meshpilot's own CA: (chain, key, root)."""
    return _mesh_client_certificate_for(mp, directory, IDENTITY)


def _mesh_client_certificate_for(mp: Meshpilot, directory: Path, identity: str) -> tuple[Path, Path, Path]:
    """A certificate of ``identity`` from meshpilot's own CA: (chain, key, root)."""
    signer, chain, roots = load_plugged(mp.ca_dir)
    authority = CertificateAuthority(signer, chain, roots)
    key = ec.generate_private_key(ec.SECP256R1())
    csr = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([])).sign(key, hashes.SHA256())
    issued = authority.sign(csr.public_bytes(serialization.Encoding.PEM), [identity])
    directory.mkdir(parents=True, exist_ok=True)
    paths = directory / "cert-chain.pem", directory / "key.pem", directory / "root-cert.pem"
    paths[0].write_text("".join(issued[:-1]))
    paths[1].write_bytes(pem_key(key))
    paths[2].write_bytes((mp.ca_dir / "root-cert.pem").read_bytes())
    return paths


def _secure_gateway(mesh: MeshHarness, mp: Meshpilot, cert_port: int) -> Envoy:
    """An Envoy gateway whose xds-grpc cluster is TLS to the port that requires a client certificate."""
    chain, key, root = _mesh_client_certificate(mp, mesh.tmp / "gw-identity")
    # The workload certificate for the mesh's clusters (auto mTLS), from the agent's SDS as for sidecars.
    sds = Sds(mesh.tmp, "gw-1", mesh.ca.issue(IDENTITY, mesh.tmp / "gw-1"))
    mesh.processes.append(sds)
    sds.start()
    sds.wait_listening()
    admin = free_port()
    bootstrap = sidecar_bootstrap(
        node_id=f"router~{GATEWAY_IP}~gw-1.istio-system~istio-system.svc.cluster.local",
        metadata={
            "NAMESPACE": "istio-system",
            "SERVICE_ACCOUNT": "istio-ingressgateway",
            "CLUSTER_ID": "Kubernetes",
            "ISTIO_VERSION": "1.28.0",
            "LABELS": {"istio": "ingressgateway"},
        },
        admin_port=admin,
        xds_port=cert_port,
        sds_socket=sds.socket,
    )
    [xds] = [c for c in bootstrap["static_resources"]["clusters"] if c["name"] == "xds-grpc"]
    xds["transport_socket"] = {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "sni": "istiod.istio-system.svc",
            "common_tls_context": {
                "alpn_protocols": ["h2"],
                "tls_certificates": [
                    {"certificate_chain": {"filename": str(chain)}, "private_key": {"filename": str(key)}}
                ],
                "validation_context": {
                    "trusted_ca": {"filename": str(root)},
                    "match_typed_subject_alt_names": [
                        {"san_type": "DNS", "matcher": {"exact": "istiod.istio-system.svc"}}
                    ],
                },
            },
        },
    }
    envoy = Envoy(mesh.tmp, "gw-1", bootstrap, admin)
    mesh.processes.append(envoy)
    envoy.start()
    envoy.wait_live()
    return envoy


def _https(
    port: int, sni: str, client: tuple[Path, Path] | None = None, timeout: float = 5.0
) -> tuple[int, str, int]:
    return https_get(GATEWAY_IP, port, sni, client, timeout)


def test_an_https_gateway_serves_certificates_from_secrets_and_follows_their_rotation(
    mesh: MeshHarness,
) -> None:
    simple_port, mutual_port = free_port(GATEWAY_IP), free_port(GATEWAY_IP)
    server_cert, server_key = certificate(["bookinfo.example.com"])
    client_ca = certificate(["client-ca"], ca=True)
    secure_cert, secure_key = certificate(["secure.example.com"])
    mesh.write("namespaces.yaml", [namespace("default"), namespace("istio-system")])
    mesh.write(
        "productpage.yaml",
        workload("productpage", "default", "10.96.0.10", 9080, {"productpage-v1": "127.0.0.91"}),
    )
    mesh.backend("productpage-v1", "127.0.0.91", 9080)
    mesh.write("gateway-pod.yaml", [pod("gw-1", "istio-system", GATEWAY_IP, {"istio": "ingressgateway"})])
    mesh.write("gateway.yaml", [_gateway(simple_port, mutual_port), _routes()])
    mesh.write(
        "secrets.yaml",
        [
            tls_secret("bookinfo-cert", (server_cert, server_key)),
            tls_secret("secure-cert", (secure_cert, secure_key), client_ca[0]),
        ],
    )
    cert_port = free_port()
    mp = mesh.start_meshpilot(extra=["--secure-grpc-client-cert-addr", f"127.0.0.1:{cert_port}"])
    envoy = _secure_gateway(mesh, mp, cert_port)

    # SIMPLE: HTTPS by SNI with the Secret's certificate.
    eventually(
        lambda: (
            attempt(lambda: _https(simple_port, "bookinfo.example.com"))
            == (200, "productpage-v1", server_cert.serial_number)
        ),
        what="HTTPS with the certificate of Secret bookinfo-cert",
    )
    # MUTUAL: a client without a certificate is refused; one the Secret's CA signed is served.
    client = write_pair(mesh.tmp / "client", "cert", certificate(["client.example.com"], issuer=client_ca))
    eventually(
        lambda: (
            attempt(lambda: _https(mutual_port, "secure.example.com", client))
            == (200, "productpage-v1", secure_cert.serial_number)
        ),
        what="mutual TLS with a client certificate of the Secret's CA",
    )
    with pytest.raises(REFUSED):
        _https(mutual_port, "secure.example.com")
    stranger = write_pair(mesh.tmp / "client", "stranger", certificate(["stranger.example.com"]))
    with pytest.raises(REFUSED):
        _https(mutual_port, "secure.example.com", stranger)

    # Rotation: the Secret's file rewritten, a new handshake sees the new certificate; no restart.
    before = envoy.stats()
    pid = envoy.proc.pid if envoy.proc is not None else None
    rotated_cert, rotated_key = certificate(["bookinfo.example.com"])
    mesh.write(
        "secrets.yaml",
        [
            tls_secret("bookinfo-cert", (rotated_cert, rotated_key)),
            tls_secret("secure-cert", (secure_cert, secure_key), client_ca[0]),
        ],
    )
    eventually(
        lambda: (
            attempt(lambda: _https(simple_port, "bookinfo.example.com"))
            == (200, "productpage-v1", rotated_cert.serial_number)
        ),
        what="the rotated certificate served",
    )
    assert envoy.rejected_updates() == {}
    # The same Envoy process, which got the new certificate as an update of the Secret it had asked for
    # (SDS on its ADS stream) and kept its listeners (none modified, so no connection was drained).
    assert envoy.running and envoy.proc is not None and envoy.proc.pid == pid
    after = envoy.stats()
    secret = "sds.kubernetes_bookinfo-cert.update_success"  # Envoy's stat name for kubernetes://bookinfo-cert
    assert after[secret] > before[secret], (before[secret], after[secret])
    assert after["listener_manager.listener_modified"] == before["listener_manager.listener_modified"]
    assert mp.metric("pilot_sds_certificate_errors_total") == 0


async def test_secrets_go_only_to_verified_proxies_of_their_namespace(mesh: MeshHarness) -> None:
    sds_type = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
    cert, key = certificate(["bookinfo.example.com"])
    mesh.write("namespaces.yaml", [namespace("default"), namespace("istio-system")])
    mesh.write("secrets.yaml", [tls_secret("bookinfo-cert", (cert, key))])
    cert_port = free_port()
    mp = mesh.start_meshpilot(extra=["--secure-grpc-client-cert-addr", f"127.0.0.1:{cert_port}"])

    def node(ns: str, account: str) -> dict[str, Any]:
        return {
            "node_id": f"router~127.0.0.95~gw-1.{ns}~{ns}.svc.cluster.local",
            "node_metadata": {"NAMESPACE": ns, "SERVICE_ACCOUNT": account, "ISTIO_VERSION": "1.28.0"},
        }

    def secure(identity: str) -> Secure:
        chain, key_path, root = _mesh_client_certificate_for(
            mp, mesh.tmp / identity.rsplit("/", 1)[1], identity
        )
        return Secure(
            root.read_bytes(), client_key_pem=key_path.read_bytes(), client_chain_pem=chain.read_bytes()
        )

    # The gateway's own namespace, verified: the key and certificate.
    own = AdsClient(f"127.0.0.1:{cert_port}", secure=secure(IDENTITY))
    try:
        own.send(sds_type, ["kubernetes://bookinfo-cert"], **node("istio-system", "istio-ingressgateway"))
        response = await own.recv(timeout=10)
        assert [r.type_url for r in response.resources] == [sds_type]
    finally:
        await own.close()
    # Another namespace's proxy naming it explicitly: nothing, and the attempt is counted.
    other = AdsClient(f"127.0.0.1:{cert_port}", secure=secure("spiffe://cluster.local/ns/default/sa/app"))
    try:
        other.send(sds_type, ["kubernetes://istio-system/bookinfo-cert"], **node("default", "app"))
        response = await other.recv(timeout=10)
        assert list(response.resources) == []
    finally:
        await other.close()
    assert mp.metric("pilot_sds_certificate_errors_total") >= 1
    # The plaintext port proves no identity: no answer at all.
    plain = AdsClient(f"127.0.0.1:{mp.grpc_port}")
    try:
        plain.send(sds_type, ["kubernetes://bookinfo-cert"], **node("istio-system", "istio-ingressgateway"))
        assert await plain.no_response(within=1.0)
    finally:
        await plain.close()
