"""Security policy shown with traffic between Envoys that agents run, as in a mesh.

Three pods, each an Envoy started by an agent with its pod's token against meshpilot's secure port,
its workload certificate from meshpilot's CA (a real kube-apiserver issues and reviews the tokens):

- ``reviews`` (service account ``reviews``), the server, run by ``meshpilot agent``: its Sidecar binds
  ingress ports 9080 and 9081 to the pod address and forwards each to an app of its own on loopback;
- ``productpage`` (``productpage``), a client, run by ``meshpilot agent``;
- ``ratings`` (``ratings``), a client, run by Istio's real pilot-agent (``build/reference/bin``) with
  Istio's bootstrap template.

No traffic capture (interception ``NONE``): a client's Sidecar binds its egress listeners to an address
of its own, where a request with ``Host: reviews`` goes through its outbound cluster, with auto mutual
TLS, to the server's inbound listener. A plaintext client is a bare request to the server's pod address.

One control plane and the three agents serve the whole module. Each test rewrites the policy file,
waits until the server's Envoy has the inbound listeners those policies make (from its config_dump:
which transport protocols each port's filter chains accept, which policies its RBAC filters name,
whether the JWT filter is there), then sends its traffic. A RequestAuthentication with a ``jwksUri`` has
its keys served by an HTTP server of the test on loopback, which meshpilot fetches and inlines.
"""

from __future__ import annotations

import http.client
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
from integration.conftest import MeshHarness
from support import reference
from support.agent_harness import (
    MESHPILOT_AGENT,
    MeshWorkload,
    PilotAgent,
    SecureControlPlane,
    start_workload_agent,
    wait_ready,
)
from support.backends import Backend
from support.jwks_server import JwksServer
from support.jwt_signer import ISSUER, Signer
from support.kube import egress_sidecar, endpoint_slice, istio, namespace, pod, service
from support.processes import free_port, http_get
from support.real_kube import RealKubeApiServer, service_account_token
from support.wait import eventually

if TYPE_CHECKING:
    from support.certs import TestCA

pytestmark = [pytest.mark.integration, pytest.mark.envoy, pytest.mark.reference, pytest.mark.timeout(300)]

SERVER = MeshWorkload("reviews-v1", "127.0.64.21", "reviews", {"app": "reviews"})
SERVER_EGRESS = "127.0.64.22"
PRODUCTPAGE = MeshWorkload("productpage-v1", "127.0.64.11", "productpage", {"app": "productpage"})
PRODUCTPAGE_EGRESS = "127.0.64.12"
RATINGS = MeshWorkload("ratings-v1", "127.0.64.13", "ratings", {"app": "ratings"})
RATINGS_EGRESS = "127.0.64.14"
#: Where the JWKS of a RequestAuthentication's jwksUri is served, for meshpilot to fetch.
JWKS_HOST = "127.0.64.31"
#: The server's two HTTP ports; each forwards to an app of its own.
MAIN, SIDE = 9080, 9081
SELECTOR = {"matchLabels": {"app": "reviews"}}
IN_MESH = {"security.istio.io/tlsMode": "istio"}
#: Envoy's counters for the server's inbound HTTP RBAC filters, ``http.<HCM stat prefix>.rbac.<outcome>``
#: (istiod's inbound stat prefix ``inbound_<bind>_<port>;``), which Istio's bootstrap keeps
#: (``rbac.allowed`` / ``rbac.denied`` are in its inclusion suffixes).
RBAC_STAT = f"http.inbound_{SERVER.ip}_{MAIN};.rbac."
DENIED = b"RBAC: access denied"


def spiffe(account: str) -> str:
    return f"spiffe://cluster.local/ns/default/sa/{account}"


# -- the mesh ---------------------------------------------------------------------------------


def _apps(app_ports: Mapping[int, int]) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = [namespace("default")]
    for workload, egress, cluster_ip in (
        (PRODUCTPAGE, PRODUCTPAGE_EGRESS, "10.96.64.10"),
        (RATINGS, RATINGS_EGRESS, "10.96.64.30"),
    ):
        app = workload.labels["app"]
        docs += [
            service(app, "default", cluster_ip, [("http", 9080)], {"app": app}),
            pod(
                workload.pod, "default", workload.ip, {**workload.labels, **IN_MESH}, workload.service_account
            ),
            endpoint_slice(f"{app}-s", "default", app, [("http", 9080)], [(workload.pod, workload.ip)]),
            egress_sidecar(app, egress),
        ]
    ports = [("http", MAIN), ("http-side", SIDE)]
    return [
        *docs,
        service("reviews", "default", "10.96.64.20", ports, {"app": "reviews"}),
        pod(SERVER.pod, "default", SERVER.ip, {**SERVER.labels, **IN_MESH}, SERVER.service_account),
        endpoint_slice("reviews-s", "default", "reviews", ports, [(SERVER.pod, SERVER.ip)]),
        # A connection per request: each request is a new handshake on the listener as it is now, so a
        # policy change is seen by the next request, not after pooled connections drain.
        istio(
            "DestinationRule",
            "reviews",
            "default",
            {
                "host": "reviews",
                "trafficPolicy": {"connectionPool": {"http": {"maxRequestsPerConnection": 1}}},
            },
        ),
        istio(
            "Sidecar",
            "reviews",
            "default",
            {
                "workloadSelector": {"labels": SERVER.labels},
                "ingress": [
                    {
                        "port": {"number": port, "protocol": "HTTP", "name": f"http-{port}"},
                        "bind": SERVER.ip,
                        "defaultEndpoint": f"127.0.0.1:{app_port}",
                    }
                    for port, app_port in app_ports.items()
                ],
                "egress": [{"bind": SERVER_EGRESS, "hosts": ["./*"]}],
            },
        ),
    ]


@dataclass(frozen=True)
class Listener:
    """What the server's Envoy has on one inbound port: the transport protocols its filter chains
    match (``raw_buffer`` plaintext, ``tls`` mutual TLS), the AuthorizationPolicies its RBAC filters
    name, and whether it runs the JWT filter."""

    transports: frozenset[str]
    policies: frozenset[str] = frozenset()
    jwt: bool = False


PERMISSIVE = frozenset({"raw_buffer", "tls"})
STRICT = frozenset({"tls"})
DISABLE = frozenset({"raw_buffer"})


@dataclass
class AgentMesh:
    harness: MeshHarness
    server: PilotAgent
    productpage: PilotAgent
    ratings: PilotAgent
    apps: dict[int, Backend]

    def apply(self, docs: list[dict[str, Any]], expected: Mapping[int, Listener]) -> None:
        """Replace the policies, then wait until the server's Envoy has the listeners they make."""
        self.harness.write("policy.yaml", docs)
        eventually(
            lambda: self.inbound() == dict(expected),
            timeout=20,
            what=f"the server's inbound listeners to become {expected}",
        )

    def inbound(self) -> dict[int, Listener]:
        dump = self.server.envoy().config_dump()
        found: dict[int, Listener] = {}
        for config in dump["configs"]:
            for dynamic in config.get("dynamic_listeners", []):
                listener = dynamic.get("active_state", {}).get("listener", {})
                address = listener.get("address", {}).get("socket_address", {})
                if address.get("address") != SERVER.ip:
                    continue
                chains = listener.get("filter_chains", [])
                text = json.dumps(chains)
                found[int(address["port_value"])] = Listener(
                    frozenset(
                        c.get("filter_chain_match", {}).get("transport_protocol", "any") for c in chains
                    ),
                    frozenset(re.findall(r"ns\[default\]-policy\[([^\]]+)\]", text)),
                    "envoy.filters.http.jwt_authn" in text,
                )
        return found

    def rbac_stats(self) -> dict[str, int]:
        return {k: v for k, v in self.server.envoy().stats().items() if k.startswith(RBAC_STAT)}

    def no_rejected_updates(self) -> None:
        for agent in (self.server, self.productpage, self.ratings):
            assert agent.envoy().rejected_updates() == {}, agent.name


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealKubeApiServer]:
    with RealKubeApiServer(tmp_path_factory.mktemp("policy-agent-kube")) as server:
        server.apply(namespace("istio-system"))
        yield server


@pytest.fixture(scope="module")
def agent_mesh(
    tmp_path_factory: pytest.TempPathFactory, ca: TestCA, kube: RealKubeApiServer
) -> Iterator[AgentMesh]:
    harness = MeshHarness(tmp_path_factory.mktemp("policy-agent"), ca)
    try:
        app_ports = {MAIN: free_port(), SIDE: free_port()}
        apps = {port: harness.backend(f"reviews-{port}", "127.0.0.1", p) for port, p in app_ports.items()}
        harness.write("apps.yaml", _apps(app_ports))
        harness.write("policy.yaml", [])
        harness.start_meshpilot(kubeconfig=kube.write_kubeconfig(harness.tmp / "kubeconfig"))
        published = eventually(
            lambda: kube.get("configmaps", "default", "istio-ca-root-cert"), what="the mesh root published"
        )
        root = str(published["data"]["root-cert.pem"]).encode()

        def secure(workload: MeshWorkload) -> SecureControlPlane:
            return SecureControlPlane(root, service_account_token(kube, workload.service_account, "default"))

        server = start_workload_agent(
            harness,
            MESHPILOT_AGENT,
            SERVER,
            secure(SERVER),
            proxy_config={"proxyStatsMatcher": {"inclusionSuffixes": ["ssl.handshake"]}},
        )
        productpage = start_workload_agent(harness, MESHPILOT_AGENT, PRODUCTPAGE, secure(PRODUCTPAGE))
        ratings = start_workload_agent(
            harness,
            [str(reference.binary("pilot-agent"))],
            RATINGS,
            secure(RATINGS),
            template=reference.istio_file("tools/packaging/common/envoy_bootstrap.json"),
            name="pilot-agent",
        )
        for agent in (server, productpage, ratings):
            wait_ready(agent)
        yield AgentMesh(harness, server, productpage, ratings, apps)
    finally:
        harness.close()


@pytest.fixture(autouse=True)
def _logs_on_failure(request: pytest.FixtureRequest, agent_mesh: AgentMesh) -> Iterator[None]:
    """The processes' logs, printed at the end of a test that failed."""
    failed = request.session.testsfailed
    yield
    if request.session.testsfailed > failed:
        print(agent_mesh.harness.logs())


# -- traffic ----------------------------------------------------------------------------------


def call(
    egress: str, path: str = "/", port: int = MAIN, headers: Mapping[str, str] | None = None
) -> tuple[int, bytes]:
    """Through a client's Envoy (its egress listener, auto mutual TLS to the server): status and body."""
    status, body, _ = http_get(egress, port, path, {"Host": "reviews", **(headers or {})})
    return status, body


def app_saw(body: bytes) -> dict[str, Any]:
    """The request as the app behind the server's Envoy got it (headers lower-cased), from its answer."""
    seen: dict[str, Any] = json.loads(body)
    seen["headers"] = {k.lower(): v for k, v in seen["headers"].items()}
    return seen


def seen_by_app(egress: str, path: str = "/", port: int = MAIN) -> dict[str, Any]:
    """A call through a client's Envoy that must reach the app: the request as the app got it."""
    status, body = call(egress, path, port)
    assert status == 200, (status, body)
    return app_saw(body)


def client_certificate(seen: Mapping[str, Any]) -> str:
    """The peer the server's Envoy saw, from the XFCC header it adds for mutual TLS ('' for none)."""
    return str(seen["headers"].get("x-forwarded-client-cert", ""))


def plaintext(port: int, path: str = "/") -> int | str:
    """A client outside the mesh, straight to the server's pod address: a status, or how it failed."""
    try:
        status, _, _ = http_get(SERVER.ip, port, path, {"Host": "reviews"}, timeout=3)
    except (OSError, http.client.HTTPException) as err:
        return type(err).__name__
    return status


def handshakes(agent_mesh: AgentMesh, port: int) -> int:
    return int(agent_mesh.server.envoy().stats().get(f"listener.{SERVER.ip}_{port}.ssl.handshake", 0))


def peer_authentication(mode: str, ports: Mapping[int, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"selector": SELECTOR, "mtls": {"mode": mode}}
    if ports:
        spec["portLevelMtls"] = {str(port): {"mode": m} for port, m in ports.items()}
    return istio("PeerAuthentication", "reviews", "default", spec, group="security")


def authz(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return istio("AuthorizationPolicy", name, "default", {"selector": SELECTOR, **spec}, group="security")


CLIENTS = ((PRODUCTPAGE_EGRESS, "productpage"), (RATINGS_EGRESS, "ratings"))


# -- PeerAuthentication -----------------------------------------------------------------------


def test_permissive_serves_mesh_clients_over_mutual_tls_and_plaintext_clients(agent_mesh: AgentMesh) -> None:
    agent_mesh.apply(
        [peer_authentication("PERMISSIVE")], {MAIN: Listener(PERMISSIVE), SIDE: Listener(PERMISSIVE)}
    )
    for egress, account in CLIENTS:
        seen = eventually(lambda egress=egress: seen_by_app(egress), timeout=20, what=f"a call from {egress}")
        assert seen["name"] == f"reviews-{MAIN}"
        # Each agent's Envoy presented the certificate meshpilot's CA issued for its pod's account.
        assert f"URI={spiffe(account)}" in client_certificate(seen)
    # (Eventually: after a port-level DISABLE the client's endpoints lose their mutual-TLS mark a
    # moment after the server's listener changes.)
    peer = eventually(
        lambda: client_certificate(seen_by_app(PRODUCTPAGE_EGRESS, port=SIDE)),
        timeout=20,
        what=f"a mutual-TLS call to port {SIDE}",
    )
    assert f"URI={spiffe('productpage')}" in peer
    for port in (MAIN, SIDE):
        status, body, _ = http_get(SERVER.ip, port, "/", {"Host": "reviews"})
        assert status == 200 and client_certificate(app_saw(body)) == ""
    agent_mesh.no_rejected_updates()


def test_strict_refuses_plaintext_and_serves_mesh_clients(agent_mesh: AgentMesh) -> None:
    agent_mesh.apply([peer_authentication("STRICT")], {MAIN: Listener(STRICT), SIDE: Listener(STRICT)})
    before = handshakes(agent_mesh, MAIN)
    for port in (MAIN, SIDE):
        outcome = plaintext(port)
        assert not isinstance(outcome, int), f"plaintext to {port} was answered {outcome}"
    for egress, account in CLIENTS:
        assert f"URI={spiffe(account)}" in client_certificate(seen_by_app(egress))
    assert handshakes(agent_mesh, MAIN) >= before + len(CLIENTS)
    agent_mesh.no_rejected_updates()


def test_a_port_level_disable_serves_plaintext_on_that_port_only(agent_mesh: AgentMesh) -> None:
    agent_mesh.apply(
        [peer_authentication("STRICT", {SIDE: "DISABLE"})], {MAIN: Listener(STRICT), SIDE: Listener(DISABLE)}
    )
    outcome = plaintext(MAIN)
    assert not isinstance(outcome, int), f"plaintext to {MAIN} was answered {outcome}"
    assert plaintext(SIDE) == 200
    # The mesh clients call the DISABLE port in plaintext too (auto mutual TLS follows the port's mode)
    # and keep mutual TLS on the STRICT one.
    for egress, account in CLIENTS:
        eventually(
            lambda egress=egress: client_certificate(seen_by_app(egress, port=SIDE)) == "",
            timeout=20,
            what=f"{egress} calling port {SIDE} in plaintext",
        )
        assert f"URI={spiffe(account)}" in client_certificate(seen_by_app(egress))
    agent_mesh.no_rejected_updates()


# -- AuthorizationPolicy ----------------------------------------------------------------------


def test_deny_on_a_path_is_403_and_counted_by_envoy(agent_mesh: AgentMesh) -> None:
    deny = authz(
        "deny-admin", {"action": "DENY", "rules": [{"to": [{"operation": {"paths": ["/admin/*"]}}]}]}
    )
    agent_mesh.apply(
        [deny],
        {
            MAIN: Listener(PERMISSIVE, frozenset({"deny-admin"})),
            SIDE: Listener(PERMISSIVE, frozenset({"deny-admin"})),
        },
    )
    before = agent_mesh.rbac_stats()
    app_requests = len(agent_mesh.apps[MAIN].requests)
    for egress, _ in CLIENTS:
        assert call(egress, "/admin/users") == (403, DENIED)
    assert plaintext(MAIN, "/admin/users") == 403
    assert len(agent_mesh.apps[MAIN].requests) == app_requests, "a denied request never reaches the app"
    for egress, _ in CLIENTS:
        assert seen_by_app(egress, "/reviews/1")["path"] == "/reviews/1"
    after = agent_mesh.rbac_stats()
    assert after.get(RBAC_STAT + "denied", 0) - before.get(RBAC_STAT + "denied", 0) == 3, after
    assert after.get(RBAC_STAT + "allowed", 0) - before.get(RBAC_STAT + "allowed", 0) == 2, after
    agent_mesh.no_rejected_updates()


def test_allow_for_a_principal_refuses_another_service_account(agent_mesh: AgentMesh) -> None:
    allow = authz(
        "allow-productpage",
        {
            "action": "ALLOW",
            "rules": [{"from": [{"source": {"principals": ["cluster.local/ns/default/sa/productpage"]}}]}],
        },
    )
    policies = frozenset({"allow-productpage"})
    agent_mesh.apply([allow], {MAIN: Listener(PERMISSIVE, policies), SIDE: Listener(PERMISSIVE, policies)})
    before = agent_mesh.rbac_stats()
    assert f"URI={spiffe('productpage')}" in client_certificate(seen_by_app(PRODUCTPAGE_EGRESS, "/reviews/1"))
    # ratings' Envoy (Istio's agent) presents its own account's certificate: not the one allowed.
    assert call(RATINGS_EGRESS, "/reviews/1") == (403, DENIED)
    # A plaintext client has no principal at all.
    assert plaintext(MAIN, "/reviews/1") == 403
    after = agent_mesh.rbac_stats()
    assert after.get(RBAC_STAT + "denied", 0) - before.get(RBAC_STAT + "denied", 0) == 2, after
    assert after.get(RBAC_STAT + "allowed", 0) - before.get(RBAC_STAT + "allowed", 0) == 1, after
    agent_mesh.no_rejected_updates()


def test_an_allow_policy_without_rules_denies_everything(agent_mesh: AgentMesh) -> None:
    policies = frozenset({"allow-nothing"})
    agent_mesh.apply(
        [authz("allow-nothing", {"action": "ALLOW"})],
        {MAIN: Listener(PERMISSIVE, policies), SIDE: Listener(PERMISSIVE, policies)},
    )
    app_requests = {port: len(app.requests) for port, app in agent_mesh.apps.items()}
    for egress, _ in CLIENTS:
        for port in (MAIN, SIDE):
            for path in ("/", "/reviews/1"):
                assert call(egress, path, port) == (403, DENIED), (egress, port, path)
    assert plaintext(MAIN) == plaintext(SIDE) == 403
    assert {port: len(app.requests) for port, app in agent_mesh.apps.items()} == app_requests
    agent_mesh.no_rejected_updates()


# -- RequestAuthentication --------------------------------------------------------------------


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_request_authentication_with_inline_jwks_and_required_request_principals(
    agent_mesh: AgentMesh,
) -> None:
    signer, stranger = Signer("k1"), Signer("k1")  # the stranger signs under the same kid, with another key
    docs = [
        istio(
            "RequestAuthentication",
            "jwt",
            "default",
            {"selector": SELECTOR, "jwtRules": [{"issuer": ISSUER, "jwks": signer.jwks()}]},
            group="security",
        ),
        authz(
            "require-alice",
            {
                "action": "ALLOW",
                "rules": [{"from": [{"source": {"requestPrincipals": [f"{ISSUER}/alice"]}}]}],
            },
        ),
    ]
    expected = Listener(PERMISSIVE, frozenset({"require-alice"}), jwt=True)
    agent_mesh.apply(docs, {MAIN: expected, SIDE: expected})
    app_requests = len(agent_mesh.apps[MAIN].requests)
    for egress, _ in CLIENTS:
        # No token: jwt_authn lets the request on, RBAC finds no request principal.
        assert call(egress, "/no-token") == (403, DENIED)
        for what, token in (
            ("wrong signature", stranger.token()),
            ("unknown issuer", signer.token(issuer="https://someone-else.test")),
            ("expired", signer.token(ttl=-600)),
            ("not a JWT", "not.a.jwt"),
        ):
            status, body = call(egress, "/bad-token", headers=bearer(token))
            assert status == 401, (egress, what, status, body)
        # A valid token of another subject: authenticated, and not the principal the policy requires.
        assert call(egress, "/bob", headers=bearer(signer.token(subject="bob"))) == (403, DENIED)
    assert len(agent_mesh.apps[MAIN].requests) == app_requests
    for egress, account in CLIENTS:
        status, body = call(egress, "/valid", headers=bearer(signer.token()))
        assert status == 200, (egress, body)
        seen = app_saw(body)
        # istiod's default (forwardOriginalToken false): the verified token is not passed on.
        assert "authorization" not in seen["headers"]
        assert f"URI={spiffe(account)}" in client_certificate(seen)
    # The same from outside the mesh: the token is all that counts (the port is PERMISSIVE).
    status, _, _ = http_get(SERVER.ip, MAIN, "/valid", {"Host": "reviews", **bearer(signer.token())})
    assert status == 200
    agent_mesh.no_rejected_updates()


def test_request_authentication_with_a_jwks_uri_fetched_by_meshpilot(agent_mesh: AgentMesh) -> None:
    signer, stranger = Signer("uri-key"), Signer("uri-key")
    jwks = JwksServer(JWKS_HOST, signer.jwks())
    try:
        docs = [
            istio(
                "RequestAuthentication",
                "jwt-uri",
                "default",
                # The fetch's own timeout (istiod's default is 5s) outlasts the time the server holds it.
                {
                    "selector": SELECTOR,
                    "jwtRules": [{"issuer": ISSUER, "jwksUri": jwks.uri, "timeout": "30s"}],
                },
                group="security",
            ),
            authz(
                "require-alice-uri",
                {
                    "action": "ALLOW",
                    "rules": [{"from": [{"source": {"requestPrincipals": [f"{ISSUER}/alice"]}}]}],
                },
            ),
        ]
        expected = Listener(PERMISSIVE, frozenset({"require-alice-uri"}), jwt=True)
        agent_mesh.apply(docs, {MAIN: expected, SIDE: expected})
        # meshpilot asked for the keys and has not got them: the server's Envoy has istiod's fail-closed
        # JWKS, so even a valid token is refused.
        eventually(lambda: jwks.requests >= 1, timeout=10, what="meshpilot fetching the JWKS")
        assert signer.modulus not in json.dumps(agent_mesh.server.envoy().config_dump())
        assert call(PRODUCTPAGE_EGRESS, "/valid", headers=bearer(signer.token()))[0] == 401
        # The keys arrive: meshpilot inlines them and pushes the server's Envoy again.
        jwks.release()
        eventually(
            lambda: call(PRODUCTPAGE_EGRESS, "/valid", headers=bearer(signer.token()))[0] == 200,
            timeout=20,
            what="a valid token accepted once meshpilot fetched the JWKS",
        )
        assert signer.modulus in json.dumps(agent_mesh.server.envoy().config_dump())
        app_requests = len(agent_mesh.apps[MAIN].requests)
        for egress, account in CLIENTS:
            for what, token in (
                ("wrong signature", stranger.token()),
                ("expired", signer.token(ttl=-600)),
                ("not a JWT", "not.a.jwt"),
            ):
                status, body = call(egress, "/bad-token", headers=bearer(token))
                assert status == 401, (egress, what, status, body)
            assert call(egress, "/no-token") == (403, DENIED)
            assert len(agent_mesh.apps[MAIN].requests) == app_requests
            status, body = call(egress, "/valid", headers=bearer(signer.token()))
            assert status == 200, (egress, body)
            assert f"URI={spiffe(account)}" in client_certificate(app_saw(body))
            app_requests += 1
    finally:
        jwks.close()
    agent_mesh.no_rejected_updates()
