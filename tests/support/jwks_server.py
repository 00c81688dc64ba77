"""A JWKS endpoint on loopback for RequestAuthentication ``jwksUri`` tests: the keys meshpilot fetches."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from bench.server import free_port


class JwksServer:
    """A plain HTTP server on loopback answering ``/jwks.json``, counting the requests and holding
    each answer until ``release`` (so the time before meshpilot has the keys can be observed)."""

    def __init__(self, host: str, jwks: str) -> None:
        self.jwks = jwks
        self.requests = 0
        self.released = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests += 1
                server.released.wait(20)
                body = server.jwks.encode() if self.path == "/jwks.json" else b"{}"
                self.send_response(200 if self.path == "/jwks.json" else 404)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.port = free_port(host)
        self.uri = f"http://{host}:{self.port}/jwks.json"
        self._http = ThreadingHTTPServer((host, self.port), Handler)
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        self._thread.start()

    def release(self) -> None:
        self.released.set()

    def close(self) -> None:
        self.release()
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(5)
