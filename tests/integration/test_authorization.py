"""AuthorizationPolicy and RequestAuthentication through real Envoys on loopback.

A server sidecar (``reviews``) binds its Sidecar ingress port to its pod address and forwards to a
loopback app; client sidecars (``productpage``, and ``ratings`` where a second identity is needed)
send through their egress listeners. The server carries the tlsMode label, so auto mutual TLS makes
the clients present their SPIFFE certificates and the server's RBAC filter sees their principals.
RequestAuthentication tokens are RS256 JWTs from ``support.jwt_signer``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.jwks_server import JwksServer
from support.jwt_signer import ISSUER, Signer
from support.kube import egress_sidecar, endpoint_slice, istio, pod, service
from support.processes import http_get
from support.wait import eventually

from bench.server import free_port

pytestmark = [pytest.mark.envoy, pytest.mark.integration]

PRODUCTPAGE_IP = "127.0.16.11"
PRODUCTPAGE_EGRESS = "127.0.16.12"
RATINGS_IP = "127.0.16.13"
RATINGS_EGRESS = "127.0.16.14"
SERVER_POD_IP = "127.0.16.21"
SERVER_EGRESS = "127.0.16.22"
JWKS_HOST = "127.0.16.31"
PORT = 9080
TCP_PORT = 9090
SELECTOR = {"matchLabels": {"app": "reviews"}}
REVIEWS_CLUSTER = f"outbound|{PORT}||reviews.default.svc.cluster.local"


# -- the mesh ---------------------------------------------------------------------------------


def apps(app_port: int, tcp_app_port: int) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for name, ip, egress in (
        ("productpage", PRODUCTPAGE_IP, PRODUCTPAGE_EGRESS),
        ("ratings", RATINGS_IP, RATINGS_EGRESS),
    ):
        cluster_ip = "10.96.16.10" if name == "productpage" else "10.96.16.30"
        docs += [
            service(name, "default", cluster_ip, [("http", PORT)], {"app": name}),
            pod(f"{name}-v1", "default", ip, {"app": name}, service_account=name),
            endpoint_slice(f"{name}-s", "default", name, [("http", PORT)], [(f"{name}-v1", ip)]),
            egress_sidecar(name, egress),
        ]
    return [
        *docs,
        service("reviews", "default", "10.96.16.20", [("http", PORT), ("tcp", TCP_PORT)], {"app": "reviews"}),
        pod(
            "reviews-v1",
            "default",
            SERVER_POD_IP,
            {"app": "reviews", "security.istio.io/tlsMode": "istio"},
            service_account="reviews",
        ),
        endpoint_slice(
            "reviews-s",
            "default",
            "reviews",
            [("http", PORT), ("tcp", TCP_PORT)],
            [("reviews-v1", SERVER_POD_IP)],
        ),
        istio(
            "Sidecar",
            "reviews",
            "default",
            {
                "workloadSelector": {"labels": {"app": "reviews"}},
                "ingress": [
                    {
                        "port": {"number": PORT, "protocol": "HTTP", "name": "http"},
                        "bind": SERVER_POD_IP,
                        "defaultEndpoint": f"127.0.0.1:{app_port}",
                    },
                    {
                        "port": {"number": TCP_PORT, "protocol": "TCP", "name": "tcp"},
                        "bind": SERVER_POD_IP,
                        "defaultEndpoint": f"127.0.0.1:{tcp_app_port}",
                    },
                ],
                "egress": [{"bind": SERVER_EGRESS, "hosts": ["./*"]}],
            },
        ),
    ]


def authz(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return istio("AuthorizationPolicy", name, "default", spec, group="security")


def request_authn(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return istio("RequestAuthentication", name, "default", spec, group="security")


DENY_ADMIN = authz(
    "deny-admin",
    {"selector": SELECTOR, "action": "DENY", "rules": [{"to": [{"operation": {"paths": ["/admin/*"]}}]}]},
)
ALLOW_PRODUCTPAGE = authz(
    "allow-productpage",
    {
        "selector": SELECTOR,
        "action": "ALLOW",
        "rules": [{"from": [{"source": {"principals": ["cluster.local/ns/default/sa/productpage"]}}]}],
    },
)
REQUIRE_JWT = authz(
    "require-jwt",
    {
        "selector": SELECTOR,
        "action": "ALLOW",
        "rules": [{"from": [{"source": {"requestPrincipals": ["*"]}}]}],
    },
)


class Mesh:
    """The started pieces of one test."""

    def __init__(self, harness: Any, policies: list[dict[str, Any]], *, ratings: bool = False) -> None:
        app_port, tcp_app_port = free_port(), free_port()
        harness.write("apps.yaml", apps(app_port, tcp_app_port))
        harness.write("policy.yaml", policies)
        self.harness = harness
        self.app = harness.backend("reviews-app", "127.0.0.1", app_port)
        self.tcp_app = harness.tcp_backend("reviews-tcp", "127.0.0.1", tcp_app_port)
        harness.start_meshpilot()
        self.server = harness.sidecar(
            "reviews-v1", SERVER_POD_IP, labels={"app": "reviews"}, service_account="reviews"
        )
        self.productpage = harness.sidecar(
            "productpage-v1", PRODUCTPAGE_IP, labels={"app": "productpage"}, service_account="productpage"
        )
        self.ratings = (
            harness.sidecar("ratings-v1", RATINGS_IP, labels={"app": "ratings"}, service_account="ratings")
            if ratings
            else None
        )
        # The mesh is up when each client's request is answered by the server's sidecar over
        # mutual TLS: a status from its RBAC or JWT filter or the app's 200, never the client's 503.
        for client, egress in ((self.productpage, PRODUCTPAGE_EGRESS), (self.ratings, RATINGS_EGRESS)):
            if client is not None:
                eventually(
                    functools.partial(answered_over_mtls, client, egress),
                    timeout=20,
                    what=f"a request from {egress} answered by the server sidecar over mutual TLS",
                )

    def rbac_stats(self) -> dict[str, int]:
        return {k: v for k, v in self.server.stats().items() if ".rbac." in k}

    def no_rejected_updates(self) -> None:
        for envoy in (self.server, self.productpage, self.ratings):
            if envoy is not None:
                assert envoy.rejected_updates() == {}, envoy.name


def answered_over_mtls(client: Any, egress: str) -> bool:
    if status(egress, "/ready") not in (200, 401, 403):
        return False
    return bool(client.stats().get(f"cluster.{REVIEWS_CLUSTER};.ssl.handshake", 0) >= 1)


def tcp_exchange(egress: str) -> str:
    """Through a client's TCP egress listener to the server's TCP port: what came back for a
    ``ping`` (the app's name line, then the echo), until the far end closed or the echo arrived."""
    with socket.create_connection((egress, TCP_PORT), timeout=5) as conn:
        conn.sendall(b"ping\n")
        got = b""
        with contextlib.suppress(OSError):
            while not got.endswith(b"ping\n"):
                chunk = conn.recv(256)
                if not chunk:
                    break
                got += chunk
    return got.decode(errors="replace")


def call(egress: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    status_code, body, _ = http_get(egress, PORT, path, {"Host": "reviews", **(headers or {})})
    return status_code, body


def status(egress: str, path: str, headers: dict[str, str] | None = None) -> int:
    return call(egress, path, headers)[0]


def becomes(expected: int, egress: str, path: str, headers: dict[str, str] | None = None) -> bool:
    got = status(egress, path, headers)
    assert got == expected, f"{path}: {got}"
    return True


def app_saw(mesh: Mesh, path: str) -> dict[str, Any]:
    """The last request the app got for ``path``, headers lower-cased."""
    seen = [r for r in mesh.app.requests if r["path"] == path]
    assert seen, f"the app got no request for {path}"
    return {k.lower(): v for k, v in seen[-1]["headers"].items()}


# -- AuthorizationPolicy --------------------------------------------------------------------------


#: Envoy's counters for the inbound HTTP RBAC filter, ``http.<HCM stat prefix>.rbac.<outcome>``; the
#: HCM's prefix is istiod's delimited inbound one (``inbound_<bind>_<port>;``).
HTTP_RBAC = f"http.inbound_{SERVER_POD_IP}_{PORT};.rbac."
HTTP_RBAC_DENIED = HTTP_RBAC + "denied"
HTTP_RBAC_ALLOWED = HTTP_RBAC + "allowed"
#: The network RBAC filter's, under istiod's ``tcp.`` stat prefix.
TCP_RBAC_DENIED = "tcp.rbac.denied"


def test_deny_on_a_path_is_403_and_counted(mesh: Any) -> None:
    m = Mesh(mesh, [DENY_ADMIN])
    denied_before = m.rbac_stats().get(HTTP_RBAC_DENIED, 0)
    app_requests = len(m.app.requests)
    code, body = call(PRODUCTPAGE_EGRESS, "/admin/x")
    assert code == 403 and body == b"RBAC: access denied"
    assert call(PRODUCTPAGE_EGRESS, "/admin/users/1")[0] == 403
    assert len(m.app.requests) == app_requests, "a denied request never reaches the app"
    assert status(PRODUCTPAGE_EGRESS, "/ok") == 200
    assert status(PRODUCTPAGE_EGRESS, "/administrator") == 200, "'/admin/*' is a prefix of segments"
    stats = m.rbac_stats()
    assert stats.get(HTTP_RBAC_DENIED, 0) - denied_before == 2, stats
    assert stats.get(HTTP_RBAC_ALLOWED, 0) >= 2, stats
    # istiod's filter carries an (empty) shadow policy with the dry-run stat prefix.
    assert stats[HTTP_RBAC + "istio_dry_run_allow_.shadow_allowed"] == 0, stats
    m.no_rejected_updates()


def test_allow_for_a_principal_denies_other_service_accounts(mesh: Any) -> None:
    m = Mesh(mesh, [ALLOW_PRODUCTPAGE], ratings=True)
    assert status(PRODUCTPAGE_EGRESS, "/reviews/1") == 200
    xfcc = app_saw(m, "/reviews/1")["x-forwarded-client-cert"]
    assert "URI=spiffe://cluster.local/ns/default/sa/productpage" in xfcc
    code, body = call(RATINGS_EGRESS, "/reviews/1")
    assert code == 403 and body == b"RBAC: access denied"
    assert m.rbac_stats().get(HTTP_RBAC_DENIED, 0) >= 1
    m.no_rejected_updates()


def test_allow_for_a_principal_on_a_tcp_port(mesh: Any) -> None:
    """The same policy on a TCP port: Envoy's network RBAC filter lets productpage's connection
    through and closes ratings' before the app's echo comes back."""
    m = Mesh(mesh, [ALLOW_PRODUCTPAGE], ratings=True)
    eventually(
        lambda: tcp_exchange(PRODUCTPAGE_EGRESS) == "reviews-tcp\nping\n",
        timeout=10,
        what="productpage over TCP",
    )
    denied_before = m.server.stats().get(TCP_RBAC_DENIED, 0)
    assert "ping" not in tcp_exchange(RATINGS_EGRESS)
    stats = m.server.stats()
    assert stats.get(TCP_RBAC_DENIED, 0) > denied_before, {k: v for k, v in stats.items() if "rbac" in k}
    assert stats.get("tcp.rbac.allowed", 0) >= 1
    m.no_rejected_updates()


@pytest.mark.parametrize(
    "spec",
    [{"selector": SELECTOR}, {"selector": SELECTOR, "action": "ALLOW"}],
    ids=["empty-spec", "allow-without-rules"],
)
def test_allow_policy_without_rules_denies_everything(mesh: Any, spec: dict[str, Any]) -> None:
    m = Mesh(mesh, [authz("allow-nothing", spec)], ratings=True)
    for egress in (PRODUCTPAGE_EGRESS, RATINGS_EGRESS):
        for path in ("/", "/ok", "/admin/x"):
            assert call(egress, path) == (403, b"RBAC: access denied"), (egress, path)
    assert not m.app.requests
    m.no_rejected_updates()


def test_a_new_deny_policy_reaches_the_running_envoy(mesh: Any) -> None:
    """The policy arrives while a client keeps calling: /admin/x turns from 200 to 403 for good,
    /ok stays 200, and no request fails any other way on the way."""
    m = Mesh(mesh, [])
    outcomes: dict[str, list[int | str]] = {"/admin/x": [], "/ok": []}
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            for path, seen in outcomes.items():
                try:
                    seen.append(status(PRODUCTPAGE_EGRESS, path))
                except OSError as err:
                    seen.append(type(err).__name__)
            time.sleep(0.02)

    worker = threading.Thread(target=traffic, daemon=True)
    worker.start()
    try:
        eventually(lambda: outcomes["/admin/x"].count(200) >= 5, timeout=10, what="traffic before")
        mesh.write("policy.yaml", [DENY_ADMIN])
        eventually(lambda: outcomes["/admin/x"][-5:] == [403] * 5, timeout=15, what="/admin/x denied")
    finally:
        stop.set()
        worker.join(10)
    admin = outcomes["/admin/x"]
    first_403 = admin.index(403)
    assert set(admin[:first_403]) == {200} and set(admin[first_403:]) == {403}, admin
    assert set(outcomes["/ok"]) == {200}, outcomes["/ok"]
    m.no_rejected_updates()


# -- RequestAuthentication ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def signer() -> Signer:
    return Signer("k1")


@pytest.fixture(scope="module")
def stranger() -> Signer:
    """Another key under the same kid: its tokens have a signature the JWKS does not verify."""
    return Signer("k1")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def check_tokens(m: Mesh, signer: Signer, stranger: Signer) -> None:
    """No token 403 (RBAC), a bad token 401 (jwt_authn), a valid token 200."""
    assert call(PRODUCTPAGE_EGRESS, "/no-token") == (403, b"RBAC: access denied")
    for what, token in (
        ("wrong signature", stranger.token()),
        ("wrong issuer", signer.token(issuer="https://someone-else.test")),
        ("expired", signer.token(ttl=-600)),
        ("not a JWT", "not.a.jwt"),
    ):
        code, body = call(PRODUCTPAGE_EGRESS, "/bad-token", bearer(token))
        assert code == 401, (what, code, body)
    assert not [r for r in m.app.requests if r["path"] in ("/no-token", "/bad-token")]
    assert status(PRODUCTPAGE_EGRESS, "/valid", bearer(signer.token())) == 200
    # istiod's default (forwardOriginalToken false): the verified token is not passed to the app.
    assert "authorization" not in app_saw(m, "/valid")


def test_request_authentication_with_inline_jwks(mesh: Any, signer: Signer, stranger: Signer) -> None:
    m = Mesh(
        mesh,
        [
            request_authn(
                "jwt", {"selector": SELECTOR, "jwtRules": [{"issuer": ISSUER, "jwks": signer.jwks()}]}
            ),
            REQUIRE_JWT,
        ],
    )
    check_tokens(m, signer, stranger)
    m.no_rejected_updates()


@pytest.fixture
def jwks_server(signer: Signer) -> Iterator[JwksServer]:
    server = JwksServer(JWKS_HOST, signer.jwks())
    try:
        yield server
    finally:
        server.close()


def test_request_authentication_with_a_fetched_jwks_uri(
    mesh: Any, signer: Signer, stranger: Signer, jwks_server: JwksServer
) -> None:
    # The fetch's own timeout (istiod's default is 5s) outlasts the time the server holds it.
    rule = {"issuer": ISSUER, "jwksUri": jwks_server.uri, "timeout": "30s"}
    m = Mesh(mesh, [request_authn("jwt", {"selector": SELECTOR, "jwtRules": [rule]}), REQUIRE_JWT])
    # meshpilot asked for the keys and has not got them yet: the fail-closed JWKS is inlined, so
    # even a valid token is refused by jwt_authn.
    eventually(lambda: jwks_server.requests >= 1, timeout=10, what="meshpilot fetching the JWKS")
    assert signer.modulus not in json.dumps(m.server.config_dump())
    code, body = call(PRODUCTPAGE_EGRESS, "/valid", bearer(signer.token()))
    assert (code, body) == (401, b"Jwt verification fails")
    # The keys arrive: meshpilot inlines them and pushes the server sidecar again.
    jwks_server.release()
    eventually(
        lambda: becomes(200, PRODUCTPAGE_EGRESS, "/valid", bearer(signer.token())),
        timeout=20,
        what="a valid token accepted once meshpilot fetched the JWKS",
    )
    assert signer.modulus in json.dumps(m.server.config_dump())
    assert "JWKS for issuer https://issuer.meshpilot.test" in mesh.meshpilot.log()
    check_tokens(m, signer, stranger)
    m.no_rejected_updates()
