"""The webhook server's TLS: certificate files when given, else a self-signed certificate.

The API server verifies the webhook's certificate against the caBundle of
the webhook configuration, for the Service name it dials; the self-signed
certificate therefore names istiod's Service in all its spellings, plus the
address it is bound to so a local client can verify it too.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from meshpilot.ca.serving import ServingCertificate, ServingPair
from meshpilot.config.errors import ConfigError

#: The names istiod's own certificate carries for the webhook Service.
ISTIOD_DNS_NAMES = (
    "istiod",
    "istiod.istio-system",
    "istiod.istio-system.svc",
    "istiod.istio-system.svc.cluster.local",
    "localhost",
)


@dataclass(frozen=True, slots=True)
class SelfSigned:
    cert_pem: bytes
    key_pem: bytes


def self_signed(host: str, *, days: int = 365) -> SelfSigned:
    """A self-signed serving certificate for istiod's names, ``host`` and the loopback address."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    dns = list(ISTIOD_DNS_NAMES)
    ips = {ipaddress.ip_address("127.0.0.1")}
    if host:
        try:
            ips.add(ipaddress.ip_address(host))
        except ValueError:
            if host not in dns:
                dns.append(host)
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in dns]
    names += [x509.IPAddress(ip) for ip in sorted(ips, key=str)]
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "istiod.istio-system.svc")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        # A little slack for clocks slightly behind ours.
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return SelfSigned(cert.public_bytes(serialization.Encoding.PEM), key_pem)


def server_context(cert_file: Path | None, key_file: Path | None, host: str) -> tuple[ssl.SSLContext, bytes]:
    """The serving context and the PEM of the certificate served (for clients to trust)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if (cert_file is None) != (key_file is None):
        raise ConfigError("--tls-cert-file and --tls-key-file must be given together")
    if cert_file is not None and key_file is not None:
        try:
            context.load_cert_chain(cert_file, key_file)
            return context, cert_file.read_bytes()
        except (OSError, ssl.SSLError) as err:
            raise ConfigError(f"cannot load webhook certificate {cert_file}, key {key_file}: {err}") from None
    generated = self_signed(host)
    # ssl loads certificates only from files; they live only as long as loading takes.
    with tempfile.TemporaryDirectory(prefix="meshpilot-webhook-") as tmp:
        cert_path, key_path = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
        cert_path.write_bytes(generated.cert_pem)
        key_path.touch(mode=0o600)
        key_path.write_bytes(generated.key_pem)
        context.load_cert_chain(cert_path, key_path)
    return context, generated.cert_pem


def serving_context(serving: ServingCertificate) -> tuple[ssl.SSLContext, bytes]:
    """A context serving istiod's certificate from the mesh CA, reloaded at each renewal (new
    handshakes get the new pair), and the mesh root: what a caBundle holds."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2

    def load(pair: ServingPair) -> None:
        # ssl loads certificates only from files; they live only as long as loading takes.
        with tempfile.TemporaryDirectory(prefix="meshpilot-webhook-") as tmp:
            cert_path, key_path = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
            cert_path.write_bytes(pair.chain_pem)
            key_path.touch(mode=0o600)
            key_path.write_bytes(pair.key_pem)
            context.load_cert_chain(cert_path, key_path)

    load(serving.current)
    serving.subscribe(load)
    return context, serving.authority.root_pem.encode()
