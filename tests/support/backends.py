"""Backends on loopback addresses that say who they are and record what they got.

HTTP backends answer every method with JSON naming themselves and echoing the
path and headers. Tests steer them at runtime: ``status`` makes them fail,
``delay`` makes them slow, so retries, timeouts and outlier detection can be
seen from a real client. TCP backends send their name and then echo.
"""

from __future__ import annotations

import json
import socket
import socketserver
import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass
class Backend:
    name: str
    host: str
    port: int
    requests: list[dict[str, Any]] = field(default_factory=list)
    #: Status every request gets; change it while running to make the backend fail.
    status: int = 200
    #: Seconds to wait before answering.
    delay: float = 0.0
    #: (certificate chain, key) PEM files: serve HTTPS instead of plain HTTP.
    tls: tuple[Path, Path] | None = None
    #: With ``tls``: require a client certificate signed by these roots (mutual TLS).
    client_ca: Path | None = None
    _server: ThreadingHTTPServer | None = None

    def start(self) -> Backend:
        backend = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body_in = self.rfile.read(length) if length else b""
                seen = {
                    "name": backend.name,
                    "method": self.command,
                    "path": self.path,
                    "headers": dict(self.headers.items()),
                    "body": body_in.decode(errors="replace"),
                }
                backend.requests.append(seen)
                if backend.delay:
                    time.sleep(backend.delay)
                body = json.dumps(seen).encode()
                self.send_response(backend.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _answer

            def log_message(self, *args: Any) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer((self.host, self.port), Handler)
        self._server.daemon_threads = True
        if self.tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*self.tls)
            if self.client_ca is not None:
                context.verify_mode = ssl.CERT_REQUIRED
                context.load_verify_locations(cafile=str(self.client_ca))
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


@dataclass
class TcpBackend:
    """A TCP server that writes ``<name>\\n`` on accept, then echoes what it reads."""

    name: str
    host: str
    port: int
    connections: int = 0
    _server: socketserver.ThreadingTCPServer | None = None

    def start(self) -> TcpBackend:
        backend = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                backend.connections += 1
                conn: socket.socket = self.request
                conn.settimeout(10)
                try:
                    conn.sendall(f"{backend.name}\n".encode())
                    while data := conn.recv(4096):
                        conn.sendall(data)
                except OSError:
                    pass

        self._server = serve_tcp(self.host, self.port, Handler)
        return self

    def stop(self) -> None:
        stop_server(self._server)
        self._server = None


def serve_tcp(
    host: str, port: int, handler: type[socketserver.BaseRequestHandler]
) -> socketserver.ThreadingTCPServer:
    """A threaded TCP server on ``host:port``, serving in a daemon thread until ``stop_server``."""
    socketserver.ThreadingTCPServer.allow_reuse_address = True
    server = socketserver.ThreadingTCPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def stop_server(server: socketserver.BaseServer | None) -> None:
    if server is not None:
        server.shutdown()
        server.server_close()


def read_line(conn: socket.socket) -> str:
    """The first line the far end sends; '' when the connection closes first."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(256)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()


def tcp_hello(host: str, port: int, timeout: float = 5.0) -> str:
    """Connect and read the first line the far end sends."""
    with socket.create_connection((host, port), timeout=timeout) as conn:
        return read_line(conn)
