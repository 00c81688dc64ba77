"""CreateCertificate over real gRPC and TLS: who may ask, what they get, and what is refused.

The server's certificate comes from the mesh CA itself (``CertificateAuthority.serving``). Tokens are
reviewed by a real kube-apiserver (``make reference``).
"""

from __future__ import annotations

import datetime
import gc
from collections.abc import AsyncIterator, Awaitable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from kubernetes.client import CoreV1Api
from prometheus_client import CollectorRegistry
from support.held import MEGABYTE, collector_off, megabytes_held
from support.real_kube import RealKubeApiServer

from meshpilot._proto.istio.security.v1alpha1 import ca_pb2, ca_pb2_grpc
from meshpilot.ca.authenticate import (
    Authenticator,
    ClientCertificate,
    KubernetesToken,
    TokenReview,
    kubernetes_token_reviewer,
)
from meshpilot.ca.authority import CertificateAuthority
from meshpilot.ca.keys import load_or_create_self_signed
from meshpilot.ca.service import CaMetrics, CertificateService

ISTIOD = "istiod.istio-system.svc"
PRODUCTPAGE = "spiffe://cluster.local/ns/default/sa/productpage"
SA_GROUPS = ("system:serviceaccounts", "system:serviceaccounts:shop", "system:authenticated")


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> CertificateAuthority:
    signing = load_or_create_self_signed(tmp_path_factory.mktemp("ca"), "cluster.local", "ecdsa")
    return CertificateAuthority(signing, (), (signing.certificate,))


@dataclass
class Running:
    port: int
    registry: CollectorRegistry
    root: bytes

    def metric(self, name: str, **labels: str) -> float:
        """A counter by istiod's name (the client library stores it with ``_total``)."""
        return self.registry.get_sample_value(f"{name}_total", labels) or 0.0


async def _serve(
    authority: CertificateAuthority, authenticators: list[Authenticator], *, client_certs: bool
) -> tuple[grpc.aio.Server, Running]:
    registry = CollectorRegistry()
    server = grpc.aio.server()
    ca_pb2_grpc.add_IstioCertificateServiceServicer_to_server(
        CertificateService(authority, authenticators, CaMetrics(registry)), server
    )
    key, chain = authority.serving([ISTIOD])
    root = authority.root_pem.encode()
    # grpcio asks for a client certificate only when it requires one (there is no "verify if given").
    credentials = grpc.ssl_server_credentials(
        [(key.encode(), "".join(chain[:-1]).encode())],
        root_certificates=root,
        require_client_auth=client_certs,
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    return server, Running(port, registry, root)


def _key_and_csr(asked: str | None = None) -> tuple[bytes, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([]))
    if asked is not None:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(asked)]), critical=False
        )
    csr = builder.sign(key, hashes.SHA256())
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return pem, csr.public_bytes(serialization.Encoding.PEM).decode()


async def _create(
    running: Running,
    csr: str,
    *,
    ttl: int = 0,
    client: tuple[bytes, bytes] | None = None,
    token: str | None = None,
) -> ca_pb2.IstioCertificateResponse:
    credentials = grpc.ssl_channel_credentials(running.root, *(client or (None, None)))
    options = [("grpc.ssl_target_name_override", ISTIOD)]
    metadata = [("authorization", f"Bearer {token}")] if token is not None else []
    async with grpc.aio.secure_channel(f"127.0.0.1:{running.port}", credentials, options=options) as channel:
        stub = ca_pb2_grpc.IstioCertificateServiceStub(channel)
        request = ca_pb2.IstioCertificateRequest(csr=csr, validity_duration=ttl)
        response: ca_pb2.IstioCertificateResponse = await stub.CreateCertificate(
            request, metadata=metadata, timeout=10
        )
        return response


def _leaf_uris(response: ca_pb2.IstioCertificateResponse) -> list[str]:
    leaf = x509.load_pem_x509_certificate(response.cert_chain[0].encode())
    return leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.UniformResourceIdentifier
    )


@pytest.fixture
async def cert_server(authority: CertificateAuthority) -> AsyncIterator[Running]:
    server, running = await _serve(authority, [ClientCertificate()], client_certs=True)
    yield running
    await server.stop(None)


def _client_credentials(authority: CertificateAuthority, identity: str) -> tuple[bytes, bytes]:
    key, csr = _key_and_csr()
    chain = authority.sign(csr.encode(), [identity])
    return key, "".join(chain[:-1]).encode()


async def test_a_client_certificate_renews_for_its_own_identity_and_no_other(
    authority: CertificateAuthority, cert_server: Running
) -> None:
    client = _client_credentials(authority, PRODUCTPAGE)
    _, csr = _key_and_csr(asked=PRODUCTPAGE)
    response = await _create(cert_server, csr, client=client)
    assert _leaf_uris(response) == [PRODUCTPAGE]
    assert response.cert_chain[-1] == authority.root_pem
    assert cert_server.metric("citadel_server_success_cert_issuance_count") == 1
    _, foreign = _key_and_csr(asked="spiffe://cluster.local/ns/kube-system/sa/admin")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await _create(cert_server, foreign, client=client)
    assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert "ns/kube-system/sa/admin" in str(refused.value.details())
    assert cert_server.metric("citadel_server_csr_sign_err_count", error_type="IDENTITY_ERROR") == 1
    assert cert_server.metric("citadel_server_success_cert_issuance_count") == 1


async def test_bad_input_gets_a_clear_error_and_the_server_keeps_serving(
    authority: CertificateAuthority, cert_server: Running
) -> None:
    client = _client_credentials(authority, PRODUCTPAGE)
    with pytest.raises(grpc.aio.AioRpcError) as garbage:
        await _create(cert_server, "not a CSR", client=client)
    assert garbage.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "CSR does not parse" in str(garbage.value.details())
    _, csr = _key_and_csr()
    twenty_years = int(datetime.timedelta(days=365 * 20).total_seconds())
    with pytest.raises(grpc.aio.AioRpcError) as long_lived:
        await _create(cert_server, csr, ttl=twenty_years, client=client)
    assert long_lived.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "max allowed TTL 90 days" in str(long_lived.value.details())
    assert cert_server.metric("citadel_server_csr_sign_err_count", error_type="CSR_ERROR") == 1
    assert cert_server.metric("citadel_server_csr_sign_err_count", error_type="TTL_ERROR") == 1
    assert _leaf_uris(await _create(cert_server, csr, client=client)) == [PRODUCTPAGE]


async def test_a_refused_csr_is_not_kept_by_the_abort(
    authority: CertificateAuthority, cert_server: Running
) -> None:
    """grpc keeps an abort's exception, and the frames of its traceback, until a full collection."""
    client = _client_credentials(authority, PRODUCTPAGE)
    with collector_off():
        code = await _status_of(_create(cert_server, "x" * MEGABYTE, client=client))
        assert code is grpc.StatusCode.INVALID_ARGUMENT
        assert megabytes_held() == 0, "the refused CSR is still held"
        requests = [o for o in gc.get_objects() if isinstance(o, ca_pb2.IstioCertificateRequest)]
        assert not requests, "the refused request is still held"


async def _status_of(call: Awaitable[object]) -> grpc.StatusCode:
    """The status a call fails with; the client's error, and the frames that name the request, go here."""
    try:
        await call
    except grpc.aio.AioRpcError as err:
        return err.code()
    raise AssertionError("the call succeeded")


async def test_a_client_without_credentials_is_refused(authority: CertificateAuthority) -> None:
    server, running = await _serve(authority, [ClientCertificate()], client_certs=False)
    try:
        _, csr = _key_and_csr()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _create(running, csr)
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
        assert refused.value.details() == "request authenticate failure"
        assert running.metric("citadel_server_authentication_failure_count") == 1
        assert running.metric("citadel_server_success_cert_issuance_count") == 0
    finally:
        await server.stop(None)


async def test_a_client_certificate_without_a_spiffe_id_is_refused(
    authority: CertificateAuthority, cert_server: Running
) -> None:
    """istiod's "cert without SAN" case: a mesh certificate naming only DNS names proves no workload."""
    key, chain = authority.serving(["somewhere.example"])
    _, csr = _key_and_csr()
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await _create(cert_server, csr, client=(key.encode(), "".join(chain[:-1]).encode()))
    assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert cert_server.metric("citadel_server_authentication_failure_count") == 1


def _reviewed(review: TokenReview) -> KubernetesToken:
    return KubernetesToken(lambda token, audience: review, lambda: "cluster.local")


@pytest.mark.parametrize(
    ("review", "identity"),
    [
        (TokenReview(True, "system:serviceaccount:shop:cart", SA_GROUPS, ("istio-ca",)), "ns/shop/sa/cart"),
        (TokenReview(False), None),
        (TokenReview(True, "system:serviceaccount:shop:cart", SA_GROUPS, ("other",)), None),
        (
            TokenReview(True, "system:serviceaccount:shop:cart", ("system:authenticated",), ("istio-ca",)),
            None,
        ),
        (TokenReview(True, "system:serviceaccount:shop:cart:extra", SA_GROUPS, ("istio-ca",)), None),
        (TokenReview(True, "system:serviceaccount:shop:a/sa/b", SA_GROUPS, ("istio-ca",)), None),
        (TokenReview(True, "alice", SA_GROUPS, ("istio-ca",)), None),
    ],
    ids=[
        "service-account",
        "unauthenticated",
        "other-audience",
        "not-in-group",
        "five-parts",
        "slash",
        "user",
    ],
)
async def test_only_a_service_accounts_token_for_the_ca_names_an_identity(
    review: TokenReview, identity: str | None
) -> None:
    caller = await _reviewed(review).authenticate({}, [("authorization", "Bearer t0ken")])
    assert (caller.identities if caller else None) == (
        (f"spiffe://cluster.local/{identity}",) if identity else None
    )
    assert await _reviewed(review).authenticate({}, []) is None  # no token, no opinion


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealKubeApiServer]:
    with RealKubeApiServer(tmp_path_factory.mktemp("kube")) as server:
        yield server


def _token(kube: RealKubeApiServer, account: str, audience: str) -> str:
    kube.apply(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": "default"}}
    )
    with kube.api_client() as client:
        request = {"spec": {"audiences": [audience], "expirationSeconds": 600}}
        status = CoreV1Api(client).create_namespaced_service_account_token(account, "default", request).status
        assert status is not None
        return str(status.token)


@pytest.mark.integration
@pytest.mark.reference
@pytest.mark.timeout(240)
async def test_a_service_account_token_reviewed_by_the_api_server_names_the_certificate(
    authority: CertificateAuthority, kube: RealKubeApiServer, tmp_path: Path
) -> None:
    reviewer = kubernetes_token_reviewer(kube.api_client())
    server, running = await _serve(
        authority, [KubernetesToken(reviewer, lambda: "cluster.local")], client_certs=False
    )
    try:
        _, csr = _key_and_csr()
        response = await _create(running, csr, token=_token(kube, "ratings", "istio-ca"))
        assert _leaf_uris(response) == ["spiffe://cluster.local/ns/default/sa/ratings"]
        for token in (_token(kube, "ratings", "someone-else"), "garbage"):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await _create(running, csr, token=token)
            assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
        assert running.metric("citadel_server_authentication_failure_count") == 2
        assert running.metric("citadel_server_success_cert_issuance_count") == 1
    finally:
        await server.stop(None)
