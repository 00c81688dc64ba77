"""Certificates, TLS Secrets and HTTPS clients for the gateway tests (``credentialName`` over SDS)."""

from __future__ import annotations

import base64
import datetime
import json
import socket
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

T = TypeVar("T")
#: A certificate and its private key.
Pair = tuple[x509.Certificate, ec.EllipticCurvePrivateKey]


def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def certificate(names: list[str], issuer: Pair | None = None, *, ca: bool = False) -> Pair:
    """A P-256 certificate for DNS ``names`` (a CA named ``names[0]`` with ``ca``), valid two hours:
    self-signed unless ``issuer`` is given."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer[0].subject if issuer else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False
        )
    return builder.sign(issuer[1] if issuer else key, hashes.SHA256()), key


def tls_secret(
    name: str, pair: Pair, ca: x509.Certificate | None = None, namespace: str = "istio-system"
) -> dict[str, Any]:
    """A ``kubernetes.io/tls`` Secret with ``tls.crt`` / ``tls.key``, and ``ca.crt`` (the client CA of a
    MUTUAL server, served as ``kubernetes://<name>-cacert``) if ``ca`` is given."""
    data = {"tls.crt": pair[0].public_bytes(serialization.Encoding.PEM), "tls.key": pem_key(pair[1])}
    if ca is not None:
        data["ca.crt"] = ca.public_bytes(serialization.Encoding.PEM)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "type": "kubernetes.io/tls",
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }


def write_pair(directory: Path, stem: str, pair: Pair) -> tuple[Path, Path]:
    """``<stem>.pem`` and ``<stem>-key.pem`` in ``directory``: a client certificate for :func:`https_get`."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{stem}.pem", directory / f"{stem}-key.pem"
    cert.write_bytes(pair[0].public_bytes(serialization.Encoding.PEM))
    key.write_bytes(pem_key(pair[1]))
    return cert, key


def https_get(
    host: str, port: int, sni: str, client: tuple[Path, Path] | None = None, timeout: float = 5.0
) -> tuple[int, str, int]:
    """GET / over TLS with ``sni`` (and the ``client`` certificate, if given): the status, the backend's
    name (else the body) and the serial of the certificate the server presented."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the serial is what is checked
    if client is not None:
        context.load_cert_chain(*client)
    with (
        socket.create_connection((host, port), timeout=timeout) as raw,
        context.wrap_socket(raw, server_hostname=sni) as conn,
    ):
        peer = conn.getpeercert(binary_form=True)
        assert peer is not None
        serial = x509.load_der_x509_certificate(peer).serial_number
        request = f"GET / HTTP/1.1\r\nHost: {sni}\r\nConnection: close\r\n\r\n"
        conn.sendall(request.encode())
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    name = str(json.loads(body)["name"]) if status == 200 else body.decode(errors="replace")
    return status, name, serial


#: How a TLS client fails against a server that refuses it (a handshake alert, a reset, an empty reply).
REFUSED = (ssl.SSLError, OSError, IndexError, ValueError)


def attempt(call: Callable[[], T]) -> T | None:
    """``call()``, or None if the server refused it."""
    try:
        return call()
    except REFUSED:
        return None
