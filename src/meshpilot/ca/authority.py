"""Signing workload certificates as istiod's CA does (``security/pkg/pki/ca``).

The certificate is built from the caller's authenticated identities: only the CSR's public key is
used, never its subject, SANs or extensions, so a CSR cannot ask for another identity. The
signature of the CSR proves the caller holds the key. TTLs follow istiod: none (or zero) is 24 h,
more than the maximum (90 days) is refused rather than cut, and no certificate outlives the
certificate that signs it.

Where istiod leaves it to Go's crypto library, meshpilot is stricter about keys: RSA below 2048
bits and curves other than P-256 and P-384 are refused.
"""

from __future__ import annotations

import datetime
import ipaddress
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID

from meshpilot.ca.keys import SigningKey

#: istiod's DEFAULT_WORKLOAD_CERT_TTL and MAX_WORKLOAD_CERT_TTL.
DEFAULT_WORKLOAD_TTL = datetime.timedelta(hours=24)
MAX_WORKLOAD_TTL = datetime.timedelta(days=90)
#: Leaves start this far in the past, so a peer whose clock is behind accepts them (istiod's skew).
CLOCK_SKEW = datetime.timedelta(minutes=2)
_MIN_RSA_BITS = 2048
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_CURVES = (ec.SECP256R1, ec.SECP384R1)


class CsrError(ValueError):
    """The CSR does not parse, its signature is wrong, or its key is too weak (INVALID_ARGUMENT)."""


class TtlError(ValueError):
    """The requested lifetime is longer than the CA issues (INVALID_ARGUMENT)."""


class SigningError(RuntimeError):
    """The CA cannot sign now, for example because its own certificate has expired (INTERNAL)."""


@dataclass(frozen=True, slots=True)
class CertificateAuthority:
    """A signing key and certificate, the chain above it and the mesh's root.

    ``chain`` holds the certificates between the signing certificate and the root (empty when the
    root signs); ``roots`` the trusted roots, the first of which ends every issued chain.
    """

    signer: SigningKey
    chain: tuple[x509.Certificate, ...]
    roots: tuple[x509.Certificate, ...]
    now: datetime.datetime | None = field(default=None, compare=False)

    @property
    def root_pem(self) -> str:
        return "".join(_pem(root) for root in self.roots)

    def sign(self, csr_pem: bytes, identities: list[str], ttl: datetime.timedelta | None = None) -> list[str]:
        """A certificate for ``identities`` (SPIFFE URIs) on the CSR's key, as CreateCertificate's
        chain: the leaf, the certificates above it, then the root."""
        if not identities:
            raise SigningError("no identity to certify")
        key = _csr_public_key(csr_pem)
        names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(i) for i in identities]
        return self._issue(key, names, _lifetime(ttl))

    def serving(
        self,
        dns_names: list[str],
        ttl: datetime.timedelta = DEFAULT_WORKLOAD_TTL,
        ip_addresses: Sequence[IPAddress] = (),
    ) -> tuple[str, list[str]]:
        """A serving key and chain for istiod's own names (15012, the webhooks), signed by the mesh CA;
        ``ip_addresses`` for clients that dial an address and check it."""
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
        names += [x509.IPAddress(ip) for ip in ip_addresses]
        chain = self._issue(key.public_key(), names, ttl)
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return key_pem.decode(), chain

    def _issue(
        self,
        key: rsa.RSAPublicKey | ec.EllipticCurvePublicKey,
        names: list[x509.GeneralName],
        lifetime: datetime.timedelta,
    ) -> list[str]:
        now = self.now or datetime.datetime.now(datetime.UTC)
        signer_expiry = self.signer.certificate.not_valid_after_utc
        if signer_expiry <= now:
            raise SigningError(f"the CA's signing certificate expired at {signer_expiry.isoformat()}")
        leaf = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([]))
            .issuer_name(self.signer.certificate.subject)
            .public_key(key)
            .serial_number(secrets.randbits(127) | 1)
            .not_valid_before(now - CLOCK_SKEW)
            .not_valid_after(min(now + lifetime, signer_expiry))
            # An empty subject makes the SAN the certificate's only name, so it is critical (RFC 5280).
            .add_extension(x509.SubjectAlternativeName(names), critical=True)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_LEAF_KEY_USAGE, critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.signer.key.public_key()),
                critical=False,
            )
            .sign(self.signer.key, hashes.SHA256())
        )
        above = [self.signer.certificate, *self.chain] if not self.signer.is_root else []
        # Ends with every root (istiod sends its whole root-cert.pem): during a root rotation a peer
        # may be on either.
        return [_pem(leaf), *(_pem(c) for c in above), self.root_pem]


_LEAF_KEY_USAGE = x509.KeyUsage(
    digital_signature=True,
    key_encipherment=True,
    content_commitment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=False,
    crl_sign=False,
    encipher_only=False,
    decipher_only=False,
)


def requested_ttl(seconds: int) -> datetime.timedelta | None:
    """A request's ``validity_duration`` as a TTL (None: the default), refused past the maximum before
    any arithmetic, so a huge value is a TTL error, not an overflow."""
    if seconds <= 0:
        return None
    if seconds > MAX_WORKLOAD_TTL.total_seconds():
        raise TtlError(
            f"requested TTL {seconds}s is greater than the max allowed TTL {MAX_WORKLOAD_TTL.days} days"
        )
    return datetime.timedelta(seconds=seconds)


def _lifetime(ttl: datetime.timedelta | None) -> datetime.timedelta:
    if ttl is None or ttl <= datetime.timedelta(0):
        return DEFAULT_WORKLOAD_TTL
    if ttl > MAX_WORKLOAD_TTL:
        raise TtlError(
            f"requested TTL {ttl} is greater than the max allowed TTL {MAX_WORKLOAD_TTL.days} days"
        )
    return ttl


def csr_identities(csr_pem: bytes) -> list[str]:
    """The URI SANs a CSR asks for; CsrError if it does not parse (a duplicated or malformed extension
    included)."""
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError as err:
        raise CsrError(f"CSR does not parse: {err}") from None
    try:
        san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    except Exception as err:  # cryptography raises several types for bad extensions
        raise CsrError(f"CSR extensions do not parse: {err}") from None
    return list(san.value.get_values_for_type(x509.UniformResourceIdentifier))


def _csr_public_key(csr_pem: bytes) -> rsa.RSAPublicKey | ec.EllipticCurvePublicKey:
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError as err:
        raise CsrError(f"CSR does not parse: {err}") from None
    try:
        signed = csr.is_signature_valid
    except (InvalidSignature, UnsupportedAlgorithm, ValueError):
        signed = False
    if not signed:
        raise CsrError("CSR signature does not match its key")
    key = csr.public_key()
    if isinstance(key, rsa.RSAPublicKey):
        if key.key_size < _MIN_RSA_BITS:
            raise CsrError(f"RSA key of {key.key_size} bits; at least {_MIN_RSA_BITS} are required")
        return key
    if isinstance(key, ec.EllipticCurvePublicKey):
        if not isinstance(key.curve, _CURVES):
            raise CsrError(f"EC key on {key.curve.name}; P-256 or P-384 is required")
        return key
    raise CsrError(f"unsupported key type {type(key).__name__}; RSA or ECDSA is required")


def _pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()
