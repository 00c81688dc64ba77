"""The secure port (istiod's 15012) of a real ``meshpilot discovery``: TLS with istiod's certificate from
the mesh CA, who may connect, and what is refused.

Tokens reviewed by a real API server are shown in ``test_mesh_identity.py``; here the callers prove
themselves with client certificates of the mesh on the port that requires one.
"""

from __future__ import annotations

import base64
import datetime
import socket
import ssl
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from support.ads_client import AdsClient, Secure, refusal
from support.kube import workload
from support.processes import free_port

from meshpilot._proto.istio.security.v1alpha1 import ca_pb2, ca_pb2_grpc
from meshpilot.ca.authority import CertificateAuthority
from meshpilot.ca.keys import load_plugged

pytestmark = [pytest.mark.integration]

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
REVIEWS = "spiffe://cluster.local/ns/default/sa/reviews"


def _authority(ca_dir: Path) -> CertificateAuthority:
    signer, chain, roots = load_plugged(ca_dir)
    return CertificateAuthority(signer, chain, roots)


def _csr(asked: str | None = None) -> tuple[bytes, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([]))
    if asked:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(asked)]), critical=False
        )
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return pem, builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM).decode()


def _duplicate_san_csr() -> str:
    """A CSR carrying its SubjectAlternativeName extension twice. cryptography will not build one, so
    the second copy goes in under a placeholder OID of the same length (2.5.29.99), renamed to the SAN's
    (2.5.29.17) in the DER afterwards; the signature no longer matches, but parsing fails first."""
    key = ec.generate_private_key(ec.SECP256R1())
    san = x509.SubjectAlternativeName([x509.UniformResourceIdentifier(REVIEWS)])
    placeholder = x509.ObjectIdentifier("2.5.29.99")
    builder = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([]))
    builder = builder.add_extension(san, critical=False)
    copy = x509.UnrecognizedExtension(placeholder, san.public_bytes())
    builder = builder.add_extension(copy, critical=False)
    der = builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.DER)
    assert der.count(b"\x06\x03\x55\x1d\x63") == 1
    der = der.replace(b"\x06\x03\x55\x1d\x63", b"\x06\x03\x55\x1d\x11")
    body = base64.encodebytes(der).decode()
    return f"-----BEGIN CERTIFICATE REQUEST-----\n{body}-----END CERTIFICATE REQUEST-----\n"


def _client(ca_dir: Path, identity: str) -> Secure:
    authority = _authority(ca_dir)
    key, csr = _csr()
    chain = authority.sign(csr.encode(), [identity])
    return Secure(
        authority.root_pem.encode(), client_key_pem=key, client_chain_pem="".join(chain[:-1]).encode()
    )


@pytest.fixture
def secure_mesh(mesh):
    mesh.write("apps.yaml", workload("reviews", "default", "10.96.0.20", 9080, {"reviews-v1": "127.0.0.21"}))
    cert_port = free_port()
    mp = mesh.start_meshpilot(extra=["--secure-grpc-client-cert-addr", f"127.0.0.1:{cert_port}"])
    return mp, f"127.0.0.1:{mp.secure_grpc_port}", f"127.0.0.1:{cert_port}"


def _ask(client: AdsClient, namespace: str, account: str) -> None:
    client.send(
        CDS,
        node_id=f"sidecar~127.0.0.21~reviews-v1.{namespace}~{namespace}.svc.cluster.local",
        node_metadata={"NAMESPACE": namespace, "SERVICE_ACCOUNT": account, "ISTIO_VERSION": "1.28.0"},
    )


async def test_a_proxy_of_its_own_namespace_and_account_is_served_others_are_refused(secure_mesh) -> None:
    mp, _, cert_target = secure_mesh
    secure = _client(mp.ca_dir, REVIEWS)
    client = AdsClient(cert_target, secure=secure)
    try:
        _ask(client, "default", "reviews")
        response = await client.recv(timeout=10)
        assert response.type_url == CDS and response.resources
    finally:
        await client.close()
    for namespace, account in (("other", "reviews"), ("default", "ratings")):
        err = await refusal(
            cert_target,
            lambda c, ns=namespace, sa=account: _ask(c, ns, sa),
            secure=secure,
        )
        assert err.code() is grpc.StatusCode.PERMISSION_DENIED, err
        assert "authorization failed" in str(err.details())
    assert mp.metric('meshpilot_xds_auth_failures{reason="authorization"}') >= 2


async def test_an_identity_of_another_trust_domain_counts_for_nothing(secure_mesh) -> None:
    mp, _, cert_target = secure_mesh
    # Issued by the mesh's own root, but for another trust domain: the namespace matches, the domain not.
    secure = _client(mp.ca_dir, "spiffe://other.example/ns/default/sa/reviews")
    err = await refusal(cert_target, lambda c: _ask(c, "default", "reviews"), secure=secure)
    assert err.code() is grpc.StatusCode.PERMISSION_DENIED


async def test_the_token_port_refuses_a_stream_without_a_credential(secure_mesh) -> None:
    mp, token_target, _ = secure_mesh
    root = (mp.ca_dir / "root-cert.pem").read_bytes()
    err = await refusal(token_target, lambda c: _ask(c, "default", "reviews"), secure=Secure(root))
    assert err.code() is grpc.StatusCode.UNAUTHENTICATED
    assert mp.metric('meshpilot_xds_auth_failures{reason="authentication"}') >= 1


async def test_the_ca_signs_for_the_callers_identity_and_refuses_bad_requests(secure_mesh) -> None:
    mp, token_target, cert_target = secure_mesh
    secure = _client(mp.ca_dir, REVIEWS)

    async def create(
        target: str, csr: str, ttl: int = 0, s: Secure = secure
    ) -> ca_pb2.IstioCertificateResponse:
        async with s.channel(target) as channel:
            stub = ca_pb2_grpc.IstioCertificateServiceStub(channel)
            request = ca_pb2.IstioCertificateRequest(csr=csr, validity_duration=ttl)
            response: ca_pb2.IstioCertificateResponse = await stub.CreateCertificate(
                request, metadata=s.metadata(), timeout=10
            )
            return response

    _, csr = _csr(REVIEWS)
    response = await create(cert_target, csr, ttl=3600)
    leaf = x509.load_pem_x509_certificate(response.cert_chain[0].encode())
    uris = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert uris.get_values_for_type(x509.UniformResourceIdentifier) == [REVIEWS]
    lifetime = leaf.not_valid_after_utc - leaf.not_valid_before_utc
    assert datetime.timedelta(minutes=60) <= lifetime <= datetime.timedelta(minutes=63)
    assert response.cert_chain[-1].encode() == (mp.ca_dir / "root-cert.pem").read_bytes()

    refused = {
        "malformed CSR": (cert_target, "not a CSR", 0, grpc.StatusCode.INVALID_ARGUMENT),
        "20-year TTL": (cert_target, csr, 20 * 365 * 86400, grpc.StatusCode.INVALID_ARGUMENT),
        "another identity": (cert_target, _csr("spiffe://cluster.local/ns/kube-system/sa/admin")[1], 0,
                             grpc.StatusCode.PERMISSION_DENIED),
    }  # fmt: skip
    for what, (target, body, ttl, code) in refused.items():
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await create(target, body, ttl)
        assert err.value.code() is code, what
    # No credential on the token port: a clear refusal, not a crash.
    root = (mp.ca_dir / "root-cert.pem").read_bytes()
    with pytest.raises(grpc.aio.AioRpcError) as anonymous:
        await create(token_target, csr, s=Secure(root))
    assert anonymous.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert mp.metric("citadel_server_authentication_failure_count") >= 1
    # A TLS client without a certificate cannot even finish the handshake on the port that requires one.
    with pytest.raises(grpc.aio.AioRpcError) as no_cert:
        await create(cert_target, csr, s=Secure(root))
    assert no_cert.value.code() is grpc.StatusCode.UNAVAILABLE
    # A CSR whose SAN extension appears twice: a protocol error, not a crash.
    with pytest.raises(grpc.aio.AioRpcError) as duplicated:
        await create(cert_target, _duplicate_san_csr())
    assert duplicated.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    # The plaintext port has no CA at all (the CA answers only where callers can be authenticated).
    async with grpc.aio.insecure_channel(f"127.0.0.1:{mp.grpc_port}") as plain:
        with pytest.raises(grpc.aio.AioRpcError) as no_ca:
            await ca_pb2_grpc.IstioCertificateServiceStub(plain).CreateCertificate(
                ca_pb2.IstioCertificateRequest(csr=csr), timeout=10
            )
    assert no_ca.value.code() is grpc.StatusCode.UNIMPLEMENTED
    # The server is unharmed: the next request is served.
    assert (await create(cert_target, csr)).cert_chain


def test_the_root_is_kept_across_restarts_and_the_serving_certificate_names_istiod(mesh) -> None:
    mesh.write("apps.yaml", workload("reviews", "default", "10.96.0.20", 9080, {"reviews-v1": "127.0.0.21"}))
    first = mesh.start_meshpilot()
    root = (first.ca_dir / "root-cert.pem").read_bytes()
    first.stop()
    second = mesh.start_meshpilot()
    assert (second.ca_dir / "root-cert.pem").read_bytes() == root
    context = ssl.create_default_context(cadata=root.decode())
    with socket.create_connection(("127.0.0.1", second.secure_grpc_port), timeout=5) as raw:
        context.set_alpn_protocols(["h2"])
        with context.wrap_socket(raw, server_hostname="istiod.istio-system.svc") as tls:
            cert = x509.load_der_x509_certificate(tls.getpeercert(binary_form=True) or b"")
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "istiod.istio-system.svc" in names.get_values_for_type(x509.DNSName)
    assert cert.not_valid_after_utc - cert.not_valid_before_utc <= datetime.timedelta(hours=24, minutes=2)
