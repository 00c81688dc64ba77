"""HTTP server for the capture tests, run inside a namespace: `echo_server.py NAME HOST PORT...`.

Answers every GET with JSON naming itself, the port hit, the peer address it saw and
the request headers, so a test can tell whether Envoy stood in between.
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    name, host, ports = sys.argv[1], sys.argv[2], [int(p) for p in sys.argv[3:]]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(
                {
                    "name": name,
                    "port": self.server.server_address[1],
                    "peer": self.client_address[0],
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                }
            ).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    servers = [ThreadingHTTPServer((host, port), Handler) for port in ports]
    for server in servers[1:]:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"{name} listening on {host}:{ports}", flush=True)
    servers[0].serve_forever()


if __name__ == "__main__":
    main()
