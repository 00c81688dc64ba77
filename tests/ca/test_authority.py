"""The CA's signing: identities from the caller, never the CSR; istiod's TTL rules; real TLS after."""

from __future__ import annotations

import datetime
import socket
import ssl
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from meshpilot.ca.authority import (
    DEFAULT_WORKLOAD_TTL,
    CertificateAuthority,
    CsrError,
    SigningError,
    TtlError,
    requested_ttl,
)
from meshpilot.ca.keys import (
    CA_CERT,
    CA_KEY,
    CERT_CHAIN,
    ROOT_CERT,
    SigningKey,
    load_or_create_self_signed,
    load_plugged,
    self_signed_root,
)
from meshpilot.config.errors import ConfigError

TRUST = "cluster.local"
PRODUCTPAGE = "spiffe://cluster.local/ns/default/sa/productpage"
REVIEWS = "spiffe://cluster.local/ns/default/sa/reviews"
NOW = datetime.datetime(2026, 11, 25, 12, 0, tzinfo=datetime.UTC)


def _csr(
    key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey, uri: str = "spiffe://evil/ns/x/sa/admin"
) -> bytes:
    """A CSR asking for ``uri``, and to be a CA: what it asks must not matter."""
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "asked-for")]))
        .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(uri)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM)


def _rsa() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def root_ca(tmp_path_factory: pytest.TempPathFactory) -> CertificateAuthority:
    signing = load_or_create_self_signed(tmp_path_factory.mktemp("ca"), TRUST, "ecdsa")
    return CertificateAuthority(signing, (), (signing.certificate,))


def _certs(chain: list[str]) -> list[x509.Certificate]:
    return [x509.load_pem_x509_certificate(pem.encode()) for pem in chain]


def _uris(cert: x509.Certificate) -> list[str]:
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return san.get_values_for_type(x509.UniformResourceIdentifier)


def test_the_certificate_names_the_callers_identity_not_what_the_csr_asks(
    root_ca: CertificateAuthority,
) -> None:
    key = _rsa()
    leaf, root = _certs(root_ca.sign(_csr(key), [PRODUCTPAGE]))
    assert _uris(leaf) == [PRODUCTPAGE]
    assert leaf.subject == x509.Name([])
    assert leaf.public_key().public_numbers() == key.public_key().public_numbers()
    assert root == root_ca.roots[0]
    leaf.verify_directly_issued_by(root)
    assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_default_and_maximum_lifetimes_are_istiods(tmp_path: Path) -> None:
    signing = load_or_create_self_signed(tmp_path, TRUST, "ecdsa", now=NOW)
    ca = CertificateAuthority(signing, (), (signing.certificate,), now=NOW)
    key = ec.generate_private_key(ec.SECP256R1())
    [leaf, _] = _certs(ca.sign(_csr(key), [PRODUCTPAGE]))
    assert leaf.not_valid_after_utc - NOW == DEFAULT_WORKLOAD_TTL
    assert NOW - leaf.not_valid_before_utc == datetime.timedelta(minutes=2)
    [leaf, _] = _certs(ca.sign(_csr(key), [PRODUCTPAGE], datetime.timedelta(hours=1)))
    assert leaf.not_valid_after_utc - NOW == datetime.timedelta(hours=1)
    with pytest.raises(TtlError, match="greater than the max allowed TTL 90 days"):
        ca.sign(_csr(key), [PRODUCTPAGE], datetime.timedelta(days=365 * 20))
    ninety_days = int(datetime.timedelta(days=90).total_seconds())
    assert requested_ttl(ninety_days) == datetime.timedelta(days=90)
    assert requested_ttl(0) is None and requested_ttl(-5) is None
    for too_long in (ninety_days + 1, 2**62):  # refused before any arithmetic could overflow
        with pytest.raises(TtlError):
            requested_ttl(too_long)


def test_no_certificate_outlives_its_signer_and_an_expired_signer_signs_nothing() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    root = self_signed_root(TRUST, key, NOW - datetime.timedelta(days=3650) + datetime.timedelta(hours=1))
    ca = CertificateAuthority(SigningKey(key, root), (), (root,), now=NOW)
    [leaf, _] = _certs(ca.sign(_csr(_rsa()), [PRODUCTPAGE]))
    assert leaf.not_valid_after_utc == root.not_valid_after_utc
    later = CertificateAuthority(SigningKey(key, root), (), (root,), now=NOW + datetime.timedelta(hours=2))
    with pytest.raises(SigningError, match="expired"):
        later.sign(_csr(_rsa()), [PRODUCTPAGE])


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (lambda: rsa.generate_private_key(public_exponent=65537, key_size=1024), "RSA key of 1024 bits"),
        (lambda: ec.generate_private_key(ec.SECP521R1()), "secp521r1"),
    ],
    ids=["rsa-1024", "p-521"],
)
def test_weak_or_unexpected_keys_are_refused(
    root_ca: CertificateAuthority, key: object, message: str
) -> None:
    with pytest.raises(CsrError, match=message):
        root_ca.sign(_csr(key()), [PRODUCTPAGE])  # type: ignore[operator]


def test_a_csr_that_does_not_parse_or_is_not_signed_by_its_key_is_refused(
    root_ca: CertificateAuthority,
) -> None:
    with pytest.raises(CsrError, match="does not parse"):
        root_ca.sign(
            b"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n", [REVIEWS]
        )
    good = _csr(ec.generate_private_key(ec.SECP256R1()))
    der = bytearray(x509.load_pem_x509_csr(good).public_bytes(serialization.Encoding.DER))
    der[-3] ^= 0x01  # inside the signature
    forged = x509.load_der_x509_csr(bytes(der)).public_bytes(serialization.Encoding.PEM)
    with pytest.raises(CsrError, match="signature"):
        root_ca.sign(forged, [REVIEWS])
    with pytest.raises(SigningError, match="no identity"):
        root_ca.sign(good, [])


def test_a_self_signed_root_is_kept_and_reused(tmp_path: Path) -> None:
    first = load_or_create_self_signed(tmp_path, TRUST, "rsa")
    assert first.certificate.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == TRUST
    assert (tmp_path / CA_KEY).stat().st_mode & 0o777 == 0o600
    again = load_or_create_self_signed(tmp_path, TRUST, "rsa")
    assert again.certificate == first.certificate
    assert isinstance(again.key, rsa.RSAPrivateKey) and again.key.key_size == 2048


def _intermediate(root_key: ec.EllipticCurvePrivateKey, root: x509.Certificate) -> SigningKey:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "intermediate")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(root.subject)
        .public_key(key.public_key())
        .serial_number(7)
        .not_valid_before(NOW - datetime.timedelta(days=1))
        .not_valid_after(NOW + datetime.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(root_key, hashes.SHA256())
    )
    return SigningKey(key, cert)


def _write_plugged(directory: Path, signing: SigningKey, root: x509.Certificate) -> None:
    pem = serialization.Encoding.PEM
    directory.mkdir(exist_ok=True)
    (directory / CA_CERT).write_bytes(signing.certificate.public_bytes(pem))
    (directory / CA_KEY).write_bytes(
        signing.key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    (directory / CERT_CHAIN).write_bytes(signing.certificate.public_bytes(pem))
    (directory / ROOT_CERT).write_bytes(root.public_bytes(pem))


def test_a_plugged_in_intermediate_issues_leaf_intermediate_root(tmp_path: Path) -> None:
    root_key = ec.generate_private_key(ec.SECP256R1())
    root = self_signed_root(TRUST, root_key, NOW - datetime.timedelta(days=1))
    _write_plugged(tmp_path, _intermediate(root_key, root), root)
    signing, above, roots = load_plugged(tmp_path)
    assert not signing.is_root and above == () and roots == (root,)
    ca = CertificateAuthority(signing, above, roots, now=NOW)
    leaf, intermediate, last = _certs(ca.sign(_csr(_rsa()), [REVIEWS]))
    leaf.verify_directly_issued_by(intermediate)
    intermediate.verify_directly_issued_by(last)
    assert last == root


def test_a_plugged_in_ca_that_does_not_fit_together_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing ca-cert\.pem, ca-key\.pem, root-cert\.pem"):
        load_plugged(tmp_path)
    root_key = ec.generate_private_key(ec.SECP256R1())
    root = self_signed_root(TRUST, root_key, NOW)
    _write_plugged(tmp_path, SigningKey(ec.generate_private_key(ec.SECP256R1()), root), root)
    with pytest.raises(ConfigError, match=r"is not the key of ca-cert\.pem"):
        load_plugged(tmp_path)
    # A right key and certificate, but a root-cert.pem that did not sign them.
    for name in (CA_CERT, CA_KEY, CERT_CHAIN, ROOT_CERT):
        (tmp_path / name).unlink()
    other_key = ec.generate_private_key(ec.SECP256R1())
    _write_plugged(tmp_path, _intermediate(root_key, root), self_signed_root("other", other_key, NOW))
    with pytest.raises(ConfigError, match=r"does not chain through cert-chain\.pem to root-cert\.pem"):
        load_plugged(tmp_path)


def _files(tmp: Path, name: str, ca: CertificateAuthority, identity: str) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    chain, key_path = tmp / f"{name}-chain.pem", tmp / f"{name}-key.pem"
    chain.write_text("".join(ca.sign(_csr(key), [identity])[:-1]))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return chain, key_path


def test_issued_certificates_make_a_mutual_tls_handshake(
    tmp_path: Path, root_ca: CertificateAuthority
) -> None:
    """Both sides present a certificate of the CA and trust only its root; each sees the other's ID."""
    root = tmp_path / "root.pem"
    root.write_text(root_ca.root_pem)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=root)
    server_ctx.load_cert_chain(*_files(tmp_path, "reviews", root_ca, REVIEWS))
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    client_ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=root)
    client_ctx.check_hostname = False  # mesh peers are checked by SPIFFE ID, not by host name
    client_ctx.load_cert_chain(*_files(tmp_path, "productpage", root_ca, PRODUCTPAGE))

    seen: dict[str, object] = {}
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)

    def serve() -> None:
        conn, _ = listener.accept()
        with server_ctx.wrap_socket(conn, server_side=True) as tls:
            seen["client"] = tls.getpeercert()
            tls.sendall(b"ok")

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with (
            socket.create_connection(listener.getsockname(), timeout=10) as raw,
            client_ctx.wrap_socket(raw) as tls,
        ):
            server_cert = tls.getpeercert()
            assert tls.recv(2) == b"ok"
    finally:
        thread.join(10)
        listener.close()
    assert server_cert is not None and ("URI", REVIEWS) in server_cert["subjectAltName"]
    client_cert = seen["client"]
    assert isinstance(client_cert, dict) and ("URI", PRODUCTPAGE) in client_cert["subjectAltName"]
