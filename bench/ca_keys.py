"""Keys, CSRs and the CA of the CA benchmark, made before anything is timed."""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from meshpilot.ca.authority import CertificateAuthority
from meshpilot.ca.keys import SigningPrivateKey, load_or_create_self_signed, new_key

TRUST_DOMAIN = "cluster.local"
ALGORITHM_NAMES = {"rsa": "RSA 2048", "ecdsa": "ECDSA P-256"}


def spiffe_id(namespace: str, account: str) -> str:
    return f"spiffe://{TRUST_DOMAIN}/ns/{namespace}/sa/{account}"


def _private_pem(key: SigningPrivateKey) -> str:
    data = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return data.decode()


def _csr(key: SigningPrivateKey, identity: str) -> bytes:
    """A CSR as istio-agent writes one: no subject, the SPIFFE URI as its one SAN."""
    builder = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([]))
    builder = builder.add_extension(
        x509.SubjectAlternativeName([x509.UniformResourceIdentifier(identity)]), critical=False
    )
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def csr_batch(algorithm: str, identities: list[str]) -> list[tuple[str, bytes]]:
    """(key PEM, CSR PEM) for each identity, each on a new key."""
    out = []
    for identity in identities:
        key = new_key(algorithm)
        out.append((_private_pem(key), _csr(key, identity)))
    return out


def make_csrs(algorithm: str, identities: list[str], processes: int = 2) -> list[tuple[str, bytes]]:
    """``csr_batch`` spread over processes when the keys are RSA (34 ms each here, ECDSA 10 µs)."""
    if algorithm != "rsa" or len(identities) < 50 or processes < 2:
        return csr_batch(algorithm, identities)
    chunks = [identities[i::processes] for i in range(processes)]
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        parts = list(pool.map(csr_batch, [algorithm] * processes, chunks))
    # Back in the identities' order (chunk i holds identities i, i + processes, ...).
    out: list[tuple[str, bytes]] = [("", b"")] * len(identities)
    for i, part in enumerate(parts):
        out[i::processes] = part
    return out


def authority_in(directory: Path, algorithm: str) -> CertificateAuthority:
    """The self-signed root kept in ``directory`` (made the first time) as a CA, as the server loads it."""
    signing = load_or_create_self_signed(directory, TRUST_DOMAIN, algorithm)
    return CertificateAuthority(signing, (), (signing.certificate,))
