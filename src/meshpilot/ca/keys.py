"""Where the CA's signing key comes from: a plugged-in CA's files, or a self-signed root.

The file names are istiod's (``ROOT_CA_DIR``, default ``./etc/cacerts``, and the ``cacerts``
Secret): ``ca-cert.pem`` and ``ca-key.pem`` sign, ``cert-chain.pem`` is the chain from the signing
certificate up (without the root), ``root-cert.pem`` holds the roots. A self-signed root is made once
and kept under the same names (istiod keeps it in the ``istio-ca-secret`` Secret), so a restart
signs with the same root and the mesh keeps trusting the certificates already issued.
"""

from __future__ import annotations

import datetime
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from meshpilot.config.errors import ConfigError

CA_CERT, CA_KEY, CERT_CHAIN, ROOT_CERT = "ca-cert.pem", "ca-key.pem", "cert-chain.pem", "root-cert.pem"
#: istiod's SELF_SIGNED_CA_CERT_TTL.
SELF_SIGNED_ROOT_TTL = datetime.timedelta(days=3650)

SigningPrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey


@dataclass(frozen=True, slots=True)
class SigningKey:
    key: SigningPrivateKey
    certificate: x509.Certificate

    @property
    def is_root(self) -> bool:
        return self.certificate.subject == self.certificate.issuer


def new_key(algorithm: str) -> SigningPrivateKey:
    """``rsa`` (2048 bits, istiod's default) or ``ecdsa`` (P-256)."""
    if algorithm == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    if algorithm == "ecdsa":
        return ec.generate_private_key(ec.SECP256R1())
    raise ConfigError(f"unknown CA key algorithm {algorithm!r}: rsa or ecdsa")


def self_signed_root(trust_domain: str, key: SigningPrivateKey, now: datetime.datetime) -> x509.Certificate:
    """istiod's self-signed root: organisation = the trust domain, ten years, a CA that signs leaves."""
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, trust_domain)])
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(secrets.randbits(127) | 1)
        .not_valid_before(now - datetime.timedelta(minutes=2))
        .not_valid_after(now + SELF_SIGNED_ROOT_TTL)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=False,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


#: A plugged-in CA as loaded: (signing key, chain above it without the root, roots).
PluggedCa = tuple[SigningKey, tuple[x509.Certificate, ...], tuple[x509.Certificate, ...]]


def load_plugged(directory: Path) -> PluggedCa:
    """A plugged-in CA from ``directory``: (signing key, chain above it without the root, roots).

    Refused with a clear error when a file is missing or unreadable, when the key does not match the
    certificate, or when the signing certificate is not a CA.
    """
    names = (CA_CERT, CA_KEY, ROOT_CERT, CERT_CHAIN)
    files = {name: (directory / name).read_bytes() for name in names if (directory / name).is_file()}
    return load_plugged_files(files, str(directory))


def load_plugged_files(files: Mapping[str, bytes], where: str) -> PluggedCa:
    """``load_plugged`` over file contents by name (a Secret's data), ``where`` naming them in errors.

    An empty file counts as missing (istiod's ``istio-ca-secret`` holds empty ``cert-chain.pem`` and
    ``key.pem``).
    """
    missing = [name for name in (CA_CERT, CA_KEY, ROOT_CERT) if not files.get(name)]
    if missing:
        raise ConfigError(f"{where}: plugged-in CA is missing {', '.join(missing)}")
    try:
        certificate = x509.load_pem_x509_certificate(files[CA_CERT])
        loaded = serialization.load_pem_private_key(files[CA_KEY], password=None)
    except TypeError:
        raise ConfigError(f"{where}: {CA_KEY} is encrypted; the CA needs it unencrypted") from None
    except ValueError as err:
        raise ConfigError(f"{where}: plugged-in CA does not parse: {err}") from None
    try:
        roots = tuple(x509.load_pem_x509_certificates(files[ROOT_CERT]))
        chain_pem = files.get(CERT_CHAIN)
        chain = tuple(x509.load_pem_x509_certificates(chain_pem)) if chain_pem else ()
    except ValueError as err:
        raise ConfigError(f"{where}: plugged-in CA does not parse: {err}") from None
    if not isinstance(loaded, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey):
        raise ConfigError(f"{where}: {CA_KEY}: RSA or ECDSA key required")
    if _public_bytes(loaded.public_key()) != _public_bytes(certificate.public_key()):
        raise ConfigError(f"{where}: {CA_KEY} is not the key of {CA_CERT}")
    try:
        is_ca = certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise ConfigError(f"{where}: {CA_CERT} is not a CA certificate")
    # cert-chain.pem starts with the signing certificate itself in istiod's layout; the chain above
    # it is what follows, up to (not including) a root.
    above = tuple(c for c in chain if c != certificate and c not in roots)
    if not _chains_to(certificate, above, roots):
        raise ConfigError(f"{where}: {CA_CERT} does not chain through {CERT_CHAIN} to {ROOT_CERT}")
    return SigningKey(loaded, certificate), above, roots


def load_self_signed_files(files: Mapping[str, bytes], where: str) -> SigningKey:
    """A kept self-signed root from its ``ca-cert.pem`` and ``ca-key.pem`` (the rest is ignored, as
    istiod ignores it: the root is ``ca-cert.pem`` itself)."""
    kept = {name: files.get(name, b"") for name in (CA_CERT, CA_KEY)}
    signing, _, _ = load_plugged_files({**kept, ROOT_CERT: kept[CA_CERT]}, where)
    if not signing.is_root:
        raise ConfigError(f"{where}: {CA_CERT} is not a self-signed root")
    return signing


def new_self_signed(
    trust_domain: str, algorithm: str = "rsa", now: datetime.datetime | None = None
) -> tuple[SigningKey, dict[str, bytes]]:
    """A new self-signed root and the files that keep it: ``ca-cert.pem``, ``root-cert.pem`` (the
    certificate) and ``ca-key.pem`` (the PKCS#8 key, unencrypted)."""
    key = new_key(algorithm)
    certificate = self_signed_root(trust_domain, key, now or datetime.datetime.now(datetime.UTC))
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    cert_pem = certificate.public_bytes(serialization.Encoding.PEM)
    return SigningKey(key, certificate), {ROOT_CERT: cert_pem, CA_CERT: cert_pem, CA_KEY: key_pem}


def load_or_create_self_signed(
    directory: Path, trust_domain: str, algorithm: str = "rsa", now: datetime.datetime | None = None
) -> SigningKey:
    """The self-signed root kept in ``directory``, made (and written) the first time."""
    if (directory / CA_CERT).is_file() or (directory / CA_KEY).is_file():
        signing, _, _ = load_plugged(directory)
        if not signing.is_root:
            raise ConfigError(f"{directory}: {CA_CERT} is not a self-signed root")
        return signing
    signing, files = new_self_signed(trust_domain, algorithm, now)
    directory.mkdir(parents=True, exist_ok=True)
    for name in (ROOT_CERT, CA_CERT):
        (directory / name).write_bytes(files[name])
    # The key last: a start interrupted before it leaves a clear "missing ca-key.pem", not a key
    # without its certificate.
    _write_private(directory / CA_KEY, files[CA_KEY])
    return signing


def _chains_to(
    certificate: x509.Certificate, above: tuple[x509.Certificate, ...], roots: tuple[x509.Certificate, ...]
) -> bool:
    """Each certificate signed by the next, the last by one of the roots (or a root itself): a CA
    whose certificates nobody in the mesh would trust is refused at start, not discovered later."""
    current = certificate
    try:
        for parent in above:
            current.verify_directly_issued_by(parent)
            current = parent
    except (ValueError, TypeError, InvalidSignature):
        return False
    if current in roots:
        return True
    for root in roots:
        try:
            current.verify_directly_issued_by(root)
        except (ValueError, TypeError, InvalidSignature):
            continue
        return True
    return False


def _write_private(path: Path, data: bytes) -> None:
    """Created 0600, so the key is never readable by others even for a moment; never through a link
    and never over an existing file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _public_bytes(key: Any) -> bytes:
    """A public key's SubjectPublicKeyInfo, to compare keys of any type."""
    info = serialization.PublicFormat.SubjectPublicKeyInfo
    data: bytes = key.public_bytes(serialization.Encoding.DER, info)
    return data


def plugged_files(
    signer: SigningKey, chain: Sequence[x509.Certificate], roots: Sequence[x509.Certificate]
) -> dict[str, bytes]:
    """A CA as the files of a plugged-in one, which ``load_plugged_files`` reads back (a push worker
    gets the main process's CA this way)."""

    def pem(certificates: Sequence[x509.Certificate]) -> bytes:
        return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certificates)

    key_pem = signer.key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return {
        CA_CERT: pem([signer.certificate]),
        CA_KEY: key_pem,
        CERT_CHAIN: pem([signer.certificate, *chain]),
        ROOT_CERT: pem(roots),
    }
