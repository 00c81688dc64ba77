"""AuthorizationPolicy CUSTOM through real Envoys: the provider's ext_authz filter asks an HTTP
authorization server written here, only about the requests the policy covers.

The server sidecar (``reviews``) binds its Sidecar ingress port to its pod address and forwards to a
loopback app; the client sidecar (``productpage``) sends through its egress listener. The
authorization server is an ordinary mesh service without a sidecar (plaintext), named by the
MeshConfig provider; the server sidecar reaches it through its outbound cluster.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import yaml
from support.kube import egress_sidecar, endpoint_slice, istio, pod, service
from support.processes import http_get
from support.wait import eventually

from bench.server import free_port

pytestmark = [pytest.mark.envoy, pytest.mark.integration]

CLIENT_IP = "127.0.17.11"
CLIENT_EGRESS = "127.0.17.12"
SERVER_IP = "127.0.17.21"
SERVER_EGRESS = "127.0.17.22"
AUTHZ_IP = "127.0.17.31"
PORT = 9080
PROVIDER = "ext-authz-http"
#: The authorization server's answer to a request it refuses: a status and a header of its own.
DENIED_STATUS = 401
DENIED_HEADER = "x-ext-authz-check-result"


class AuthzServer:
    """Allows a check whose ``x-ext-authz`` header is ``allow`` (and names the user to the app),
    refuses any other with 401 and its own header; records every check it gets."""

    def __init__(self, host: str, port: int) -> None:
        self.checks: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _check(self) -> None:
                headers = {k.lower(): v for k, v in self.headers.items()}
                server.checks.append({"method": self.command, "path": self.path, "headers": headers})
                allowed = headers.get("x-ext-authz") == "allow"
                body = b"" if allowed else b"denied by the test's ext-authz server"
                self.send_response(200 if allowed else DENIED_STATUS)
                if allowed:
                    self.send_header("x-ext-authz-user", "alice")
                else:
                    self.send_header(DENIED_HEADER, "denied")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _check

            def log_message(self, *args: Any) -> None:
                pass

        self._http = ThreadingHTTPServer((host, port), Handler)
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(5)


def mesh_config(authz_port: int, *, fail_open: bool) -> dict[str, Any]:
    return {
        "extensionProviders": [
            {
                "name": PROVIDER,
                "envoyExtAuthzHttp": {
                    "service": "ext-authz.default.svc.cluster.local",
                    "port": authz_port,
                    "timeout": "2s",
                    "pathPrefix": "/check",
                    "failOpen": fail_open,
                    "includeRequestHeadersInCheck": ["x-ext-authz"],
                    "headersToUpstreamOnAllow": ["x-ext-authz-user"],
                    "headersToDownstreamOnDeny": [DENIED_HEADER],
                },
            }
        ]
    }


def objects(app_port: int, authz_port: int) -> list[dict[str, Any]]:
    return [
        service("productpage", "default", "10.96.17.10", [("http", PORT)], {"app": "productpage"}),
        pod("productpage-v1", "default", CLIENT_IP, {"app": "productpage"}, service_account="productpage"),
        endpoint_slice(
            "productpage-s", "default", "productpage", [("http", PORT)], [("productpage-v1", CLIENT_IP)]
        ),
        egress_sidecar("productpage", CLIENT_EGRESS),
        service("reviews", "default", "10.96.17.20", [("http", PORT)], {"app": "reviews"}),
        pod(
            "reviews-v1",
            "default",
            SERVER_IP,
            {"app": "reviews", "security.istio.io/tlsMode": "istio"},
            service_account="reviews",
        ),
        endpoint_slice("reviews-s", "default", "reviews", [("http", PORT)], [("reviews-v1", SERVER_IP)]),
        istio(
            "Sidecar",
            "reviews",
            "default",
            {
                "workloadSelector": {"labels": {"app": "reviews"}},
                "ingress": [
                    {
                        "port": {"number": PORT, "protocol": "HTTP", "name": "http"},
                        "bind": SERVER_IP,
                        "defaultEndpoint": f"127.0.0.1:{app_port}",
                    }
                ],
                "egress": [{"bind": SERVER_EGRESS, "hosts": ["./*"]}],
            },
        ),
        # The authorization server: a mesh service without a sidecar (no tlsMode label: plaintext).
        service("ext-authz", "default", "10.96.17.30", [("http", authz_port)], {"app": "ext-authz"}),
        pod("ext-authz-v1", "default", AUTHZ_IP, {"app": "ext-authz"}, service_account="ext-authz"),
        endpoint_slice(
            "ext-authz-s", "default", "ext-authz", [("http", authz_port)], [("ext-authz-v1", AUTHZ_IP)]
        ),
        istio(
            "AuthorizationPolicy",
            "ext-protected",
            "default",
            {
                "selector": {"matchLabels": {"app": "reviews"}},
                "action": "CUSTOM",
                "provider": {"name": PROVIDER},
                "rules": [{"to": [{"operation": {"paths": ["/protected/*"]}}]}],
            },
            group="security",
        ),
    ]


class Mesh:
    def __init__(self, harness: Any, authz_port: int, *, fail_open: bool) -> None:
        app_port = free_port()
        harness.write("mesh.yaml", objects(app_port, authz_port))
        config = harness.tmp / "meshconfig.yaml"
        config.write_text(yaml.safe_dump(mesh_config(authz_port, fail_open=fail_open)))
        self.app = harness.backend("reviews-app", "127.0.0.1", app_port)
        harness.start_meshpilot(mesh_config=config)
        self.server = harness.sidecar(
            "reviews-v1", SERVER_IP, labels={"app": "reviews"}, service_account="reviews"
        )
        self.client = harness.sidecar(
            "productpage-v1", CLIENT_IP, labels={"app": "productpage"}, service_account="productpage"
        )
        # Up when a request the policy does not cover is answered by the app through both sidecars.
        eventually(lambda: call("/public")[0] == 200, timeout=20, what="/public through both sidecars")

    def app_saw(self, path: str) -> dict[str, str]:
        seen = [r for r in self.app.requests if r["path"] == path]
        assert seen, f"the app got no request for {path}"
        return {k.lower(): v for k, v in seen[-1]["headers"].items()}

    def no_rejected_updates(self) -> None:
        for envoy in (self.server, self.client):
            assert envoy.rejected_updates() == {}, envoy.name


def call(path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
    return http_get(CLIENT_EGRESS, PORT, path, {"Host": "reviews", **(headers or {})})


@pytest.fixture
def authz_port() -> int:
    return free_port(AUTHZ_IP)


@pytest.fixture
def authz_server(authz_port: int) -> Iterator[AuthzServer]:
    server = AuthzServer(AUTHZ_IP, authz_port)
    try:
        yield server
    finally:
        server.close()


def test_covered_requests_are_checked_and_others_never_reach_the_server(
    mesh: Any, authz_port: int, authz_server: AuthzServer
) -> None:
    m = Mesh(mesh, authz_port, fail_open=False)
    assert not authz_server.checks, "/public is not covered by the CUSTOM policy"

    code, _, _ = call("/protected/a", {"x-ext-authz": "allow"})
    assert code == 200
    (check,) = authz_server.checks
    # Envoy asks at pathPrefix + the request's path, with the header the provider includes.
    assert check["path"] == "/check/protected/a"
    assert check["headers"]["x-ext-authz"] == "allow"
    # On allow, the header the provider lets upstream reaches the app.
    assert m.app_saw("/protected/a")["x-ext-authz-user"] == "alice"

    code, body, headers = call("/protected/b", {"x-ext-authz": "deny"})
    assert (code, body) == (DENIED_STATUS, b"denied by the test's ext-authz server")
    assert headers[DENIED_HEADER] == "denied"
    assert not [r for r in m.app.requests if r["path"] == "/protected/b"]
    assert call("/protected/c")[0] == DENIED_STATUS, "no header: denied"
    assert len(authz_server.checks) == 3

    for path in ("/public", "/protected", "/other/protected/x"):
        assert call(path, {"x-ext-authz": "deny"})[0] == 200, path
    assert len(authz_server.checks) == 3, "requests no CUSTOM rule covers never reach the server"
    stats = m.server.stats()
    assert stats.get("http.inbound_127.0.17.21_9080;.ext_authz.denied", 0) == 2, {
        k: v for k, v in stats.items() if "ext_authz" in k
    }
    m.no_rejected_updates()


@pytest.mark.parametrize(
    ("fail_open", "expected"), [(True, 200), (False, 403)], ids=["fail-open", "fail-closed"]
)
def test_with_the_server_down_fail_open_decides(
    mesh: Any, authz_port: int, fail_open: bool, expected: int
) -> None:
    m = Mesh(mesh, authz_port, fail_open=fail_open)
    code, _, _ = call("/protected/a", {"x-ext-authz": "allow"})
    assert code == expected
    assert call("/public")[0] == 200
    stats = m.server.stats()
    assert stats.get("http.inbound_127.0.17.21_9080;.ext_authz.error", 0) >= 1, {
        k: v for k, v in stats.items() if "ext_authz" in k
    }
    m.no_rejected_updates()
