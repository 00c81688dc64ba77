"""meshpilot's identity plane on a real Kubernetes API server: the CA kept in ``istio-ca-secret``, the
root published as ``istio-ca-root-cert`` in every namespace and as istiod's webhooks' caBundle, and
service-account tokens, reviewed by that API server, as the credential of the CA and of xDS on the
secure port (istiod's default for sidecars).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from kubernetes.client import CoreV1Api
from support.ads_client import AdsClient, Secure, refusal
from support.kube import namespace
from support.processes import Meshpilot
from support.real_kube import RealKubeApiServer
from support.wait import eventually

from meshpilot._proto.istio.security.v1alpha1 import ca_pb2, ca_pb2_grpc

pytestmark = [pytest.mark.integration, pytest.mark.reference, pytest.mark.timeout(240)]

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
ROOT_CONFIGMAP = "istio-ca-root-cert"


@dataclass
class Cluster:
    kube: RealKubeApiServer
    meshpilot: Meshpilot

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.meshpilot.secure_grpc_port}"

    def root(self) -> bytes:
        configmap = self.kube.get("configmaps", "default", ROOT_CONFIGMAP)
        assert configmap is not None
        return str(configmap["data"]["root-cert.pem"]).encode()

    def token(self, account: str, audience: str = "istio-ca", ns: str = "default") -> str:
        self.kube.apply(
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": ns}}
        )
        with self.kube.api_client() as client:
            request = {"spec": {"audiences": [audience], "expirationSeconds": 600}}
            status = CoreV1Api(client).create_namespaced_service_account_token(account, ns, request).status
            assert status is not None
            return str(status.token)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("identity")
    with RealKubeApiServer(workdir / "kube") as kube:
        for name in ("istio-system", "shop"):
            kube.apply(namespace(name))
        mp = Meshpilot(workdir, None, kubeconfig=kube.write_kubeconfig(workdir / "kubeconfig"))
        mp.start()
        try:
            mp.wait_ready(60)
            yield Cluster(kube, mp)
        finally:
            mp.stop()


def _resigned(kube: RealKubeApiServer, token: str, expires_in: int) -> str:
    """``token`` re-signed with the API server's own service-account key, expiring ``expires_in``
    seconds from now (negative: already expired)."""
    header, payload, _ = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    now = int(time.time())
    claims.update(iat=now - 1200, nbf=now - 1200, exp=now + expires_in)

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    signing_input = f"{header}.{b64(json.dumps(claims).encode())}"
    key = serialization.load_pem_private_key((kube.workdir / "pki" / "sa.key").read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    r, s = decode_dss_signature(key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
    return f"{signing_input}.{b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


def _csr(asked: str | None = None) -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([]))
    if asked:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(asked)]), critical=False
        )
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM).decode()


async def _create(cluster: Cluster, secure: Secure, csr: str) -> ca_pb2.IstioCertificateResponse:
    async with secure.channel(cluster.target) as channel:
        stub = ca_pb2_grpc.IstioCertificateServiceStub(channel)
        response: ca_pb2.IstioCertificateResponse = await stub.CreateCertificate(
            ca_pb2.IstioCertificateRequest(csr=csr), metadata=secure.metadata(), timeout=15
        )
        return response


def _ask(client: AdsClient, ns: str, account: str) -> None:
    client.send(
        CDS,
        node_id=f"sidecar~10.1.0.7~reviews-v1-abc.{ns}~{ns}.svc.cluster.local",
        node_metadata={"NAMESPACE": ns, "SERVICE_ACCOUNT": account, "ISTIO_VERSION": "1.28.0"},
    )


def test_the_root_is_kept_in_istio_ca_secret_and_published_in_every_namespace(cluster: Cluster) -> None:
    kube = cluster.kube
    secret = kube.get("secrets", "istio-system", "istio-ca-secret")
    assert secret is not None and secret["type"] == "istio.io/ca-root"
    root = base64.b64decode(secret["data"]["root-cert.pem"])
    for ns in ("default", "shop", "istio-system"):
        eventually(lambda ns=ns: kube.get("configmaps", ns, ROOT_CONFIGMAP), what=f"root in {ns}")
        assert cluster.root() == root
    kube.apply(namespace("arrived-later"))
    eventually(
        lambda: kube.get("configmaps", "arrived-later", ROOT_CONFIGMAP), what="root in a new namespace"
    )
    kube.delete("configmaps", "shop", ROOT_CONFIGMAP)
    restored = eventually(lambda: kube.get("configmaps", "shop", ROOT_CONFIGMAP), what="root restored")
    assert str(restored["data"]["root-cert.pem"]).encode() == root


def test_the_webhooks_of_istiod_get_the_root_as_their_ca_bundle(cluster: Cluster) -> None:
    webhook: dict[str, Any] = {
        "name": "namespace.sidecar-injector.istio.io",
        "clientConfig": {
            "url": "https://127.0.0.1:1/inject",
            "caBundle": base64.b64encode(b"stale").decode(),
        },
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "namespaceSelector": {"matchLabels": {"never": "matches"}},
    }
    cluster.kube.apply(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "istio-sidecar-injector", "labels": {"istio.io/rev": "default"}},
            "webhooks": [webhook],
        }
    )

    def patched() -> bytes | None:
        got = cluster.kube.get("mutatingwebhookconfigurations", "", "istio-sidecar-injector")
        bundle = base64.b64decode(got["webhooks"][0]["clientConfig"].get("caBundle", "")) if got else b""
        return bundle if bundle == cluster.root() else None

    eventually(patched, what="caBundle patched with the mesh root")


async def test_a_service_account_token_is_the_credential_of_the_ca_and_of_secure_xds(
    cluster: Cluster,
) -> None:
    root = eventually(lambda: cluster.kube.get("configmaps", "default", ROOT_CONFIGMAP), what="root")
    assert root
    token = cluster.token("reviews")
    secure = Secure(cluster.root(), token=token)
    response = await _create(cluster, secure, _csr("spiffe://cluster.local/ns/default/sa/reviews"))
    leaf = x509.load_pem_x509_certificate(response.cert_chain[0].encode())
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.UniformResourceIdentifier) == [
        "spiffe://cluster.local/ns/default/sa/reviews"
    ]
    assert response.cert_chain[-1].encode() == cluster.root()

    client = AdsClient(cluster.target, secure=secure)
    try:
        _ask(client, "default", "reviews")
        assert (await client.recv(timeout=15)).type_url == CDS
    finally:
        await client.close()

    issued = cluster.meshpilot.metric("citadel_server_success_cert_issuance_count")
    # Another namespace's workload, over xDS and at the CA: refused, nothing issued.
    denied = await refusal(cluster.target, lambda c: _ask(c, "shop", "reviews"), secure=secure)
    assert denied.code() is grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.aio.AioRpcError) as foreign:
        await _create(cluster, secure, _csr("spiffe://cluster.local/ns/shop/sa/reviews"))
    assert foreign.value.code() is grpc.StatusCode.PERMISSION_DENIED
    # Tokens that prove nothing: wrong audience, expired (forged with the API server's own key), garbage.
    for what, bad in (
        ("wrong audience", cluster.token("reviews", audience="someone-else")),
        ("expired", _resigned(cluster.kube, token, -600)),
        ("garbage", "not-a-token"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _create(cluster, Secure(cluster.root(), token=bad), _csr())
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED, what
        err = await refusal(
            cluster.target, lambda c: _ask(c, "default", "reviews"), secure=Secure(cluster.root(), token=bad)
        )
        assert err.code() is grpc.StatusCode.UNAUTHENTICATED, what
    mp = cluster.meshpilot
    assert mp.metric("citadel_server_success_cert_issuance_count") == issued
    assert mp.metric("citadel_server_authentication_failure_count") >= 3
    assert mp.metric('meshpilot_xds_auth_failures{reason="authentication"}') >= 3
    assert mp.metric('meshpilot_xds_auth_failures{reason="authorization"}') >= 1
    # The same re-signing with a future expiry is accepted: the refusal above was the expiry's.
    assert (
        await _create(cluster, Secure(cluster.root(), token=_resigned(cluster.kube, token, 600)), _csr())
    ).cert_chain
