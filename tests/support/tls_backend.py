"""A TLS server on loopback that says who it is, and a client that asks by SNI.

The server holds a self-signed certificate for the names it serves; after the
handshake it writes ``<name> <sni>\\n`` (the SNI it saw, ``-`` if none), then
echoes. A proxy that routes TLS by SNI without terminating it passes the
client's ClientHello through untouched, so the server sees the client's SNI.
"""

from __future__ import annotations

import datetime
import socket
import socketserver
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from support.backends import read_line, serve_tcp, stop_server


def self_signed(names: Sequence[str], directory: Path) -> tuple[Path, Path]:
    """A certificate (and key) for ``names``, signed by itself; returns (cert, key) paths."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=2))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    cert_path = directory / "tls-cert.pem"
    key_path = directory / "tls-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


@dataclass
class TlsBackend:
    """A TLS server named ``name`` serving ``names`` with a self-signed certificate kept in ``directory``."""

    name: str
    host: str
    port: int
    names: Sequence[str]
    directory: Path
    #: SNI values of the handshakes it completed, in order.
    server_names: list[str] = field(default_factory=list)
    cert: Path | None = None
    _server: socketserver.ThreadingTCPServer | None = None

    def start(self) -> TlsBackend:
        self.cert, key = self_signed(self.names, self.directory / self.name)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, key)
        backend = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                raw: socket.socket = self.request
                raw.settimeout(10)
                try:
                    with context.wrap_socket(raw, server_side=True) as conn:
                        sni = getattr(conn, "sni", None) or "-"
                        backend.server_names.append(sni)
                        conn.sendall(f"{backend.name} {sni}\n".encode())
                        while data := conn.recv(4096):
                            conn.sendall(data)
                except (OSError, ssl.SSLError):
                    pass

        def remember_sni(conn: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _: object) -> None:
            conn.sni = server_name  # type: ignore[union-attr]

        context.sni_callback = remember_sni  # type: ignore[assignment]
        self._server = serve_tcp(self.host, self.port, Handler)
        return self

    def stop(self) -> None:
        stop_server(self._server)
        self._server = None


def tls_hello(
    host: str,
    port: int,
    server_name: str,
    cafile: Path | None = None,
    timeout: float = 5.0,
    alpn: Sequence[str] = (),
) -> str:
    """TLS-connect with ``server_name`` as SNI (and ``alpn`` offered) and return the first line the
    server sends.

    With ``cafile`` the server's certificate must verify for ``server_name``;
    without it any certificate is accepted. '' when the connection closes first.
    """
    context = ssl.create_default_context(cafile=str(cafile)) if cafile else ssl.create_default_context()
    if cafile is None:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if alpn:
        context.set_alpn_protocols(list(alpn))
    with (
        socket.create_connection((host, port), timeout=timeout) as raw,
        context.wrap_socket(raw, server_hostname=server_name) as conn,
    ):
        return read_line(conn)
