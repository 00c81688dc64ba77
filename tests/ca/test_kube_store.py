"""The CA's key on Kubernetes (``meshpilot.ca.kube_store``), against a real kube-apiserver
(``make reference``): istiod's ``istio-ca-secret`` made once and reused, ``cacerts`` preferred, and
broken content refused with nothing written."""

from __future__ import annotations

import base64
import datetime
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from support.kube import namespace
from support.real_kube import RealKubeApiServer

from meshpilot.ca import kube_store
from meshpilot.ca.authority import CertificateAuthority
from meshpilot.ca.keys import SigningKey, self_signed_root
from meshpilot.ca.kube_store import CA_SECRET, CA_SECRET_TYPE, load_signing_material
from meshpilot.config.errors import ConfigError

pytestmark = [pytest.mark.reference, pytest.mark.timeout(180)]

NS = "istio-system"
TRUST = "cluster.local"
NOW = datetime.datetime.now(datetime.UTC)
PEM = serialization.Encoding.PEM


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealKubeApiServer]:
    with RealKubeApiServer(tmp_path_factory.mktemp("kube")) as started:
        yield started


@pytest.fixture
def kube(server: RealKubeApiServer) -> RealKubeApiServer:
    server.reset()
    server.apply(namespace(NS))
    return server


def _secret(name: str, data: dict[str, bytes], secret_type: str = "Opaque") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NS},
        "type": secret_type,
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _intermediate(root_key: ec.EllipticCurvePrivateKey, root: x509.Certificate) -> SigningKey:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "intermediate")]))
        .issuer_name(root.subject)
        .public_key(key.public_key())
        .serial_number(11)
        .not_valid_before(NOW - datetime.timedelta(days=1))
        .not_valid_after(NOW + datetime.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(root_key, hashes.SHA256())
    )
    return SigningKey(key, cert)


def _plugged() -> tuple[dict[str, bytes], SigningKey, x509.Certificate]:
    root_key = ec.generate_private_key(ec.SECP256R1())
    root = self_signed_root("plugged-root", root_key, NOW - datetime.timedelta(days=1))
    signing = _intermediate(root_key, root)
    assert isinstance(signing.key, ec.EllipticCurvePrivateKey)
    cert_pem = signing.certificate.public_bytes(PEM)
    files = {
        "ca-cert.pem": cert_pem,
        "ca-key.pem": _key_pem(signing.key),
        "root-cert.pem": root.public_bytes(PEM),
        "cert-chain.pem": cert_pem + root.public_bytes(PEM),
    }
    return files, signing, root


def _csr() -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    csr = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([])).sign(key, hashes.SHA256())
    return csr.public_bytes(PEM)


def test_the_self_signed_root_is_made_once_in_istiods_secret_and_reused(kube: RealKubeApiServer) -> None:
    with kube.api_client() as api:
        first = load_signing_material(api, NS, TRUST, "ecdsa")
        again = load_signing_material(api, NS, TRUST, "ecdsa")
    assert first.signer.is_root and first.chain == () and first.roots == (first.signer.certificate,)
    assert "made" in first.source and "from Secret istio-system/istio-ca-secret" in again.source
    assert again.signer.certificate == first.signer.certificate
    org = first.signer.certificate.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value
    assert org == TRUST
    # istiod's layout: its type, the root and key under istiod's names, empty chain and key.pem.
    secret = kube.get("secrets", NS, CA_SECRET)
    assert secret is not None and secret["type"] == CA_SECRET_TYPE == "istio.io/ca-root"
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    cert_pem = first.signer.certificate.public_bytes(PEM)
    assert data == {
        "ca-cert.pem": cert_pem,
        "root-cert.pem": cert_pem,
        "ca-key.pem": data["ca-key.pem"],
        "cert-chain.pem": b"",
        "key.pem": b"",
    }
    assert serialization.load_pem_private_key(data["ca-key.pem"], None).public_key() == (
        first.signer.key.public_key()
    )


def test_replicas_starting_together_sign_with_one_root(
    kube: RealKubeApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Deterministically: this replica looked before the other made the Secret, so its create gets 409.
    with kube.api_client() as api:
        winner = load_signing_material(api, NS, TRUST, "ecdsa")
        real_read = kube_store._read
        looks: list[str] = []

        def late_read(core: Any, ns: str, name: str) -> Any:
            looks.append(name)
            return None if looks.count(CA_SECRET) == 1 and name == CA_SECRET else real_read(core, ns, name)

        monkeypatch.setattr(kube_store, "_read", late_read)
        loser = load_signing_material(api, NS, TRUST, "ecdsa")
    assert looks.count(CA_SECRET) == 2
    assert loser.signer.certificate == winner.signer.certificate
    assert "made" not in loser.source

    # And for real: four replicas at once, one Secret, one root.
    monkeypatch.undo()
    kube.delete("secrets", NS, CA_SECRET)
    barrier = threading.Barrier(4)
    roots: list[x509.Certificate] = []

    def start() -> None:
        with kube.api_client() as api:
            barrier.wait(timeout=10)
            roots.append(load_signing_material(api, NS, TRUST, "ecdsa").signer.certificate)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(roots) == 4 and len(set(roots)) == 1
    stored = kube.get("secrets", NS, CA_SECRET)
    assert stored is not None
    assert base64.b64decode(stored["data"]["ca-cert.pem"]) == roots[0].public_bytes(PEM)


def test_a_plugged_in_intermediate_in_cacerts_wins(kube: RealKubeApiServer) -> None:
    with kube.api_client() as api:
        self_signed = load_signing_material(api, NS, TRUST, "ecdsa")  # istio-ca-secret exists too
        files, signing, root = _plugged()
        kube.apply(_secret("cacerts", files))
        material = load_signing_material(api, NS, TRUST, "ecdsa")
    assert material.signer.certificate == signing.certificate
    assert material.signer.certificate != self_signed.signer.certificate
    assert material.chain == () and material.roots == (root,)
    assert material.source == "plugged-in CA from Secret istio-system/cacerts"
    ca = CertificateAuthority(*material[:3])
    leaf, intermediate, last = x509.load_pem_x509_certificates(
        "".join(ca.sign(_csr(), ["spiffe://a/b"])).encode()
    )
    leaf.verify_directly_issued_by(intermediate)
    intermediate.verify_directly_issued_by(last)
    assert last == root


def test_a_kubernetes_tls_cacerts_is_read_as_istiod_reads_it(kube: RealKubeApiServer) -> None:
    files, signing, root = _plugged()
    tls = {"tls.crt": files["ca-cert.pem"], "tls.key": files["ca-key.pem"], "ca.crt": files["root-cert.pem"]}
    kube.apply(_secret("cacerts", tls, "kubernetes.io/tls"))
    with kube.api_client() as api:
        material = load_signing_material(api, NS, TRUST)
    assert material.signer.certificate == signing.certificate and material.roots == (root,)


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        (
            lambda f: {k: v for k, v in f.items() if k != "ca-key.pem"},
            r"cacerts: plugged-in CA is missing ca-key\.pem",
        ),
        (
            lambda f: {**f, "ca-key.pem": _key_pem(ec.generate_private_key(ec.SECP256R1()))},
            r"is not the key of",
        ),
        (lambda f: {**f, "root-cert.pem": b"-----BEGIN CERTIFICATE-----\nAAAA\n"}, r"does not parse"),
        (
            lambda f: {
                **f,
                "root-cert.pem": self_signed_root(
                    "other", ec.generate_private_key(ec.SECP256R1()), NOW
                ).public_bytes(PEM),
            },
            r"does not chain through cert-chain\.pem to root-cert\.pem",
        ),
    ],
    ids=["missing-key", "wrong-key", "unparsable-root", "other-root"],
)
def test_a_broken_cacerts_is_a_clear_error_and_nothing_is_written(
    kube: RealKubeApiServer, broken: Any, message: str
) -> None:
    files, _, _ = _plugged()
    kube.apply(_secret("cacerts", broken(files)))
    with kube.api_client() as api, pytest.raises(ConfigError, match=message) as raised:
        load_signing_material(api, NS, TRUST)
    assert "Secret istio-system/cacerts" in str(raised.value)
    assert kube.get("secrets", NS, CA_SECRET) is None


def test_a_broken_istio_ca_secret_is_refused_not_replaced(kube: RealKubeApiServer) -> None:
    files, _, _ = _plugged()  # an intermediate: not a self-signed root
    kube.apply(_secret(CA_SECRET, files, CA_SECRET_TYPE))
    before = kube.get("secrets", NS, CA_SECRET)
    with (
        kube.api_client() as api,
        pytest.raises(ConfigError, match=r"istio-ca-secret: ca-cert\.pem is not a self-signed root"),
    ):
        load_signing_material(api, NS, TRUST)
    after = kube.get("secrets", NS, CA_SECRET)
    assert before is not None and after is not None
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
