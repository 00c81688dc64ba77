"""The agent's CA client against a real CreateCertificate service over gRPC and TLS.

``CaServer`` (an in-process CertificateService with a token authenticator that
accepts one token) is shared with the other agent tests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from prometheus_client import CollectorRegistry

from meshpilot._proto.istio.security.v1alpha1 import ca_pb2_grpc
from meshpilot.agent.ca_client import CaClient, CaError, key_algorithm, new_key_and_csr
from meshpilot.ca.authenticate import Caller
from meshpilot.ca.authority import CertificateAuthority
from meshpilot.ca.keys import load_or_create_self_signed
from meshpilot.ca.service import CaMetrics, CertificateService

ISTIOD = "istiod.istio-system.svc"
IDENTITY = "spiffe://cluster.local/ns/shop/sa/productpage"
TOKEN = "a-productpage-token"


def new_authority(directory: Path) -> CertificateAuthority:
    signing = load_or_create_self_signed(directory, "cluster.local", "ecdsa")
    return CertificateAuthority(signing, (), (signing.certificate,))


class OneToken:
    """Accepts one bearer token as ``identity``; remembers the metadata of every call."""

    def __init__(self, token: str, identity: str) -> None:
        self.token = token
        self.identity = identity
        self.seen: list[dict[str, str]] = []

    async def authenticate(
        self, auth: dict[str, list[bytes]], metadata: Sequence[tuple[str, Any]]
    ) -> Caller | None:
        values = {str(k): str(v) for k, v in metadata}
        self.seen.append(values)
        if values.get("authorization") == f"Bearer {self.token}":
            return Caller((self.identity,), "test token")
        return None


class CaServer:
    """CreateCertificate on 127.0.0.1 over TLS, served as ``ISTIOD``; stoppable and restartable on
    the same port."""

    def __init__(self, authority: CertificateAuthority, authenticator: OneToken) -> None:
        self.authority = authority
        self.authenticator = authenticator
        self.root = authority.root_pem.encode()
        self.port = 0
        self._server: grpc.aio.Server | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        server = grpc.aio.server()
        service = CertificateService(self.authority, [self.authenticator], CaMetrics(CollectorRegistry()))
        ca_pb2_grpc.add_IstioCertificateServiceServicer_to_server(service, server)
        key, chain = self.authority.serving([ISTIOD])
        credentials = grpc.ssl_server_credentials([(key.encode(), "".join(chain[:-1]).encode())])
        port = server.add_secure_port(f"127.0.0.1:{self.port}", credentials)
        assert port, f"cannot listen on 127.0.0.1:{self.port}"
        self.port = port
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)
            self._server = None

    def client(self, token: str | None = TOKEN, **kwargs: Any) -> CaClient:
        kwargs.setdefault("server_name", ISTIOD)
        return CaClient(self.address, root_pem=self.root, token=lambda: token, **kwargs)


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> CertificateAuthority:
    return new_authority(tmp_path_factory.mktemp("ca"))


@pytest.fixture
async def ca(authority: CertificateAuthority) -> AsyncIterator[CaServer]:
    server = CaServer(authority, OneToken(TOKEN, IDENTITY))
    await server.start()
    yield server
    await server.stop()


def _uris(cert: x509.Certificate) -> list[str]:
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return san.get_values_for_type(x509.UniformResourceIdentifier)


def _spki(key: Any) -> bytes:
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


async def test_the_leaf_certifies_the_authenticated_identity_on_our_key(ca: CaServer) -> None:
    key_pem, csr = new_key_and_csr(IDENTITY, "ecdsa")
    client = ca.client(cluster_id="east")
    try:
        chain = await client.sign(csr, 3600)
    finally:
        await client.close()
    leaf = x509.load_pem_x509_certificate(chain[0].encode())
    assert _uris(leaf) == [IDENTITY]
    key = serialization.load_pem_private_key(key_pem, password=None)
    assert _spki(leaf.public_key()) == _spki(key.public_key())
    lifetime = leaf.not_valid_after_utc - leaf.not_valid_before_utc
    assert 3600 <= lifetime.total_seconds() <= 3600 + 300, "the TTL asked for, plus the CA's back-dating"
    assert chain[-1] == ca.authority.root_pem
    assert ca.authenticator.seen[-1]["clusterid"] == "east"


async def test_a_wrong_token_is_unauthenticated_and_the_token_is_read_for_every_call(ca: CaServer) -> None:
    tokens = iter(["stale-token", None, TOKEN])
    client = CaClient(ca.address, root_pem=ca.root, token=lambda: next(tokens), server_name=ISTIOD)
    _, csr = new_key_and_csr(None, "ecdsa")
    try:
        with pytest.raises(CaError) as wrong:
            await client.sign(csr, 3600)
        with pytest.raises(CaError) as missing:
            await client.sign(csr, 3600)
        chain = await client.sign(csr, 3600)
    finally:
        await client.close()
    assert wrong.value.code is grpc.StatusCode.UNAUTHENTICATED
    assert wrong.value.message == "request authenticate failure"
    assert str(wrong.value) == f"CA at {ca.address}: UNAUTHENTICATED: request authenticate failure"
    assert missing.value.code is grpc.StatusCode.UNAUTHENTICATED
    assert [s.get("authorization") for s in ca.authenticator.seen] == [
        "Bearer stale-token",
        None,
        f"Bearer {TOKEN}",
    ]
    assert all(s["clusterid"] == "Kubernetes" for s in ca.authenticator.seen), "pilot-agent's default"
    assert _uris(x509.load_pem_x509_certificate(chain[0].encode())) == [IDENTITY]


async def test_a_serving_name_other_than_expected_fails_the_handshake(ca: CaServer) -> None:
    _, csr = new_key_and_csr(None, "ecdsa")
    client = ca.client(server_name="istiod.elsewhere.svc")
    try:
        with pytest.raises(CaError) as failure:
            await client.sign(csr, 3600)
    finally:
        await client.close()
    assert failure.value.code is grpc.StatusCode.UNAVAILABLE
    assert str(failure.value).startswith(f"CA at {ca.address}: UNAVAILABLE: ")
    assert "hostname verification check failed" in failure.value.message.lower()
    assert ca.authenticator.seen == [], "nothing reached the service"


async def test_a_ca_that_does_not_chain_to_our_root_is_not_trusted(ca: CaServer, tmp_path: Path) -> None:
    other_root = new_authority(tmp_path / "other").root_pem.encode()
    _, csr = new_key_and_csr(None, "ecdsa")
    client = CaClient(ca.address, root_pem=other_root, token=lambda: TOKEN, server_name=ISTIOD)
    try:
        with pytest.raises(CaError) as failure:
            await client.sign(csr, 3600)
    finally:
        await client.close()
    assert failure.value.code is grpc.StatusCode.UNAVAILABLE
    assert ca.authenticator.seen == []


def test_keys_and_csrs_are_pilot_agents() -> None:
    rsa_key, rsa_csr = new_key_and_csr(IDENTITY, "rsa")
    key = serialization.load_pem_private_key(rsa_key, password=None)
    assert isinstance(key, rsa.RSAPrivateKey) and key.key_size == 2048
    csr = x509.load_pem_x509_csr(rsa_csr)
    assert csr.is_signature_valid
    assert csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.UniformResourceIdentifier
    ) == [IDENTITY]
    ec_key, _ = new_key_and_csr(None, "ecdsa")
    loaded = serialization.load_pem_private_key(ec_key, password=None)
    assert isinstance(loaded, ec.EllipticCurvePrivateKey) and loaded.curve.name == "secp256r1"
    assert [key_algorithm(v) for v in ("ECDSA", "ecdsa", "", "RSA")] == ["ecdsa", "ecdsa", "rsa", "rsa"]
    with pytest.raises(ValueError, match="unknown key algorithm 'dsa'"):
        new_key_and_csr(None, "dsa")
