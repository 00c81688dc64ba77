"""VirtualService and DestinationRule HTTP features, each shown by real traffic through a real Envoy.

One meshpilot and one client sidecar serve the whole module: each feature is a
route of one VirtualService (told apart by path), so the module costs one
Envoy start. The client sidecar captures nothing (INTERCEPTION_MODE NONE);
its egress listener is bound to the client address, so requests to
``CLIENT_IP:9080`` with a ``Host`` header are routed as an application's
would be.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from integration.conftest import MeshHarness
from support import certs
from support.backends import Backend
from support.kube import egress_sidecar, istio, namespace, workload
from support.processes import http_get
from support.wait import eventually

pytestmark = [pytest.mark.envoy, pytest.mark.integration]

CLIENT_IP = "127.0.0.11"
PORT = 9080

REVIEWS = {"reviews-v1": "127.0.0.21", "reviews-v2": "127.0.0.22", "reviews-v3": "127.0.0.23"}
FLAKY = {"flaky-bad": "127.0.0.51", "flaky-good": "127.0.0.52"}
HASHED = {"hashed-a": "127.0.0.71", "hashed-b": "127.0.0.72", "hashed-c": "127.0.0.73"}


def _route(path: str, *, subset: str = "v1", **extra: Any) -> dict[str, Any]:
    return {
        "name": path.strip("/") or "root",
        "match": [{"uri": {"prefix": path}}],
        "route": [{"destination": {"host": "reviews", "subset": subset}}],
        **extra,
    }


REVIEWS_ROUTES: list[dict[str, Any]] = [
    {
        "name": "weights",
        "match": [{"uri": {"prefix": "/weights"}}],
        "route": [
            {"destination": {"host": "reviews", "subset": "v1"}, "weight": 75},
            {"destination": {"host": "reviews", "subset": "v2"}, "weight": 25},
        ],
    },
    {
        "name": "header",
        "match": [{"headers": {"x-user": {"exact": "jason"}}}],
        "route": [{"destination": {"host": "reviews", "subset": "v2"}}],
    },
    {
        "name": "query",
        "match": [{"queryParams": {"canary": {"exact": "yes"}}}],
        "route": [{"destination": {"host": "reviews", "subset": "v3"}}],
    },
    {
        "name": "regex",
        "match": [{"uri": {"regex": "/items/[0-9]+"}}],
        "route": [{"destination": {"host": "reviews", "subset": "v3"}}],
    },
    {
        "name": "method",
        "match": [{"uri": {"prefix": "/method"}, "method": {"exact": "POST"}}],
        "route": [{"destination": {"host": "reviews", "subset": "v2"}}],
    },
    {
        "name": "nocase",
        "match": [{"uri": {"exact": "/CaseLess"}, "ignoreUriCase": True}],
        "route": [{"destination": {"host": "reviews", "subset": "v3"}}],
    },
    _route("/abort", fault={"abort": {"httpStatus": 418, "percentage": {"value": 100}}}),
    _route("/delay", fault={"delay": {"fixedDelay": "1s", "percentage": {"value": 100}}}),
    {
        "name": "redirect",
        "match": [{"uri": {"prefix": "/redirect"}}],
        "redirect": {"uri": "/elsewhere", "authority": "new.example", "redirectCode": 302},
    },
    _route("/rewrite/", rewrite={"uri": "/rewritten/", "authority": "rewritten.example"}),
    _route(
        "/headers",
        headers={
            "request": {"set": {"x-added": "yes"}, "remove": ["x-drop"]},
            "response": {"set": {"x-answer": "42"}},
        },
    ),
    _route("/mirror", mirror={"host": "shadow"}, mirrorPercentage={"value": 100}),
    _route(
        "/cors",
        corsPolicy={
            "allowOrigins": [{"exact": "https://shop.example"}],
            "allowMethods": ["GET", "PUT"],
            "allowHeaders": ["x-token"],
            "maxAge": "600s",
        },
    ),
    _route("/", subset="v1"),
]


def _config(mesh: MeshHarness) -> None:
    mesh.write("namespace.yaml", [namespace("default")])
    mesh.write("client.yaml", workload("client", "default", "10.96.0.10", PORT, {"client-1": CLIENT_IP}))
    versions = {name: name.rsplit("-", 1)[1] for name in REVIEWS}
    mesh.write("reviews.yaml", workload("reviews", "default", "10.96.0.20", PORT, REVIEWS, versions=versions))
    mesh.write("shadow.yaml", workload("shadow", "default", "10.96.0.40", PORT, {"shadow-1": "127.0.0.91"}))
    mesh.write("flaky.yaml", workload("flaky", "default", "10.96.0.50", PORT, FLAKY))
    mesh.write("slow.yaml", workload("slow", "default", "10.96.0.60", PORT, {"slow-1": "127.0.0.61"}))
    mesh.write("hashed.yaml", workload("hashed", "default", "10.96.0.70", PORT, HASHED))
    mesh.write(
        "cookie.yaml",
        workload(
            "cookie", "default", "10.96.0.80", PORT, {"cookie-a": "127.0.0.81", "cookie-b": "127.0.0.82"}
        ),
    )
    mesh.write(
        "ratings.yaml", workload("ratings", "default", "10.96.0.30", PORT, {"ratings-1": "127.0.0.31"})
    )
    mesh.write(
        "istio.yaml",
        [
            egress_sidecar("client", CLIENT_IP),
            istio(
                "DestinationRule",
                "reviews",
                "default",
                {
                    "host": "reviews",
                    "subsets": [{"name": v, "labels": {"version": v}} for v in ("v1", "v2", "v3")],
                },
            ),
            istio("VirtualService", "reviews", "default", {"hosts": ["reviews"], "http": REVIEWS_ROUTES}),
            istio(
                "VirtualService",
                "flaky",
                "default",
                {
                    "hosts": ["flaky"],
                    "http": [
                        {
                            "match": [{"uri": {"prefix": "/retry"}}],
                            "route": [{"destination": {"host": "flaky"}}],
                            "retries": {"attempts": 5, "retryOn": "5xx"},
                        },
                        {"route": [{"destination": {"host": "flaky"}}], "retries": {"attempts": 0}},
                    ],
                },
            ),
            istio(
                "VirtualService",
                "slow",
                "default",
                {
                    "hosts": ["slow"],
                    "http": [
                        {
                            "match": [{"uri": {"prefix": "/pertry"}}],
                            "route": [{"destination": {"host": "slow"}}],
                            "timeout": "10s",
                            "retries": {"attempts": 2, "perTryTimeout": "0.3s", "retryOn": "5xx"},
                        },
                        {"route": [{"destination": {"host": "slow"}}], "timeout": "0.5s"},
                    ],
                },
            ),
            istio(
                "DestinationRule",
                "hashed",
                "default",
                {
                    "host": "hashed",
                    "trafficPolicy": {"loadBalancer": {"consistentHash": {"httpHeaderName": "x-key"}}},
                },
            ),
            istio(
                "DestinationRule",
                "cookie",
                "default",
                {
                    "host": "cookie",
                    "trafficPolicy": {
                        "loadBalancer": {"consistentHash": {"httpCookie": {"name": "affinity", "ttl": "60s"}}}
                    },
                },
            ),
            # A root VirtualService handing /v... to a delegate that lives apart from it.
            istio(
                "VirtualService",
                "ratings-root",
                "default",
                {
                    "hosts": ["ratings"],
                    "http": [
                        {
                            "name": "root",
                            "match": [{"uri": {"prefix": "/v"}}],
                            "delegate": {"name": "ratings-delegate"},
                        }
                    ],
                },
            ),
            istio(
                "VirtualService",
                "ratings-delegate",
                "default",
                {
                    "http": [
                        {
                            "match": [{"uri": {"prefix": "/v2"}}],
                            "route": [{"destination": {"host": "reviews", "subset": "v2"}}],
                        },
                        {"route": [{"destination": {"host": "ratings"}}]},
                    ]
                },
            ),
        ],
    )


@pytest.fixture(scope="module")
def traffic(tmp_path_factory: pytest.TempPathFactory, ca: certs.TestCA) -> Iterator[dict[str, Backend]]:
    mesh = MeshHarness(tmp_path_factory.mktemp("http-traffic"), ca)
    failed = False
    try:
        _config(mesh)
        backends = {}
        for group in (REVIEWS, FLAKY, HASHED, {"shadow-1": "127.0.0.91", "slow-1": "127.0.0.61"}):
            for name, ip in group.items():
                backends[name] = mesh.backend(name, ip, PORT)
        for name, ip in {
            "cookie-a": "127.0.0.81",
            "cookie-b": "127.0.0.82",
            "ratings-1": "127.0.0.31",
        }.items():
            backends[name] = mesh.backend(name, ip, PORT)
        backends["flaky-bad"].status = 503
        backends["slow-1"].delay = 1.0
        mesh.start_meshpilot()
        mesh.sidecar("client-1", CLIENT_IP, labels={"app": "client"}, service_account="client")
        # Ready when the last-written VirtualService routes.
        eventually(lambda: call("ratings", "/v2/x")[1] == "reviews-v2", timeout=30, what="routes pushed")
        yield backends
    except BaseException:
        failed = True
        raise
    finally:
        mesh.close()
        if failed:
            print(mesh.logs())


def call(
    host: str, path: str = "/", headers: dict[str, str] | None = None, method: str = "GET"
) -> tuple[int, str, dict[str, str], dict[str, Any]]:
    """(status, backend name or body text, response headers, what the backend saw)."""
    status, body, response_headers = http_get(
        CLIENT_IP, PORT, path, {"Host": host, **(headers or {})}, method=method, timeout=10
    )
    try:
        seen = json.loads(body)
    except ValueError:
        return status, body.decode(errors="replace"), response_headers, {}
    # Header names as Envoy forwards them are lowercase; compare them so.
    seen["headers"] = {k.lower(): v for k, v in seen.get("headers", {}).items()}
    return status, seen.get("name", ""), response_headers, seen


def names(host: str, path: str, n: int, headers: dict[str, str] | None = None) -> Counter[str]:
    return Counter(call(host, path, headers)[1] for _ in range(n))


def test_weights_split_traffic_within_tolerance(traffic):
    seen = names("reviews", "/weights", 400)
    assert set(seen) == {"reviews-v1", "reviews-v2"}
    share = seen["reviews-v2"] / 400
    # 25% expected; 400 draws give a standard deviation of ~2.2 points.
    assert 0.17 < share < 0.33, seen


def test_header_query_regex_method_and_case_matches_pick_subsets(traffic):
    assert names("reviews", "/", 5, {"x-user": "jason"}) == Counter({"reviews-v2": 5})
    assert names("reviews", "/", 5, {"x-user": "someone"}) == Counter({"reviews-v1": 5})
    assert names("reviews", "/?canary=yes", 5) == Counter({"reviews-v3": 5})
    assert names("reviews", "/?canary=no", 5) == Counter({"reviews-v1": 5})
    assert names("reviews", "/items/42", 5) == Counter({"reviews-v3": 5})
    assert names("reviews", "/items/abc", 5) == Counter({"reviews-v1": 5})
    assert call("reviews", "/method", method="POST")[1] == "reviews-v2"
    assert call("reviews", "/method", method="GET")[1] == "reviews-v1"
    assert call("reviews", "/caseless")[1] == "reviews-v3"
    assert call("reviews", "/CASELESS")[1] == "reviews-v3"


def test_abort_returns_its_status_and_delay_delays(traffic):
    status, _, _, _ = call("reviews", "/abort")
    assert status == 418
    assert not any(r["path"] == "/abort" for r in traffic["reviews-v1"].requests)
    start = time.monotonic()
    status, name, _, _ = call("reviews", "/delay")
    elapsed = time.monotonic() - start
    assert (status, name) == (200, "reviews-v1")
    assert 0.9 <= elapsed < 3, elapsed


def test_redirect_is_seen_by_the_client(traffic):
    status, _, headers, _ = call("reviews", "/redirect/x")
    assert status == 302
    assert headers["location"] == "http://new.example/elsewhere"


def test_rewrite_is_seen_by_the_backend(traffic):
    status, name, _, seen = call("reviews", "/rewrite/page?q=1")
    assert (status, name) == (200, "reviews-v1")
    assert seen["path"] == "/rewritten/page?q=1"
    assert seen["headers"]["host"] == "rewritten.example"


def test_request_and_response_headers_are_set_and_removed(traffic):
    status, _, headers, seen = call("reviews", "/headers", {"x-drop": "gone", "x-keep": "kept"})
    assert status == 200
    assert seen["headers"].get("x-added") == "yes"
    assert "x-drop" not in seen["headers"]
    assert seen["headers"].get("x-keep") == "kept"
    assert headers.get("x-answer") == "42"


def test_mirror_traffic_reaches_the_shadow(traffic):
    shadow = traffic["shadow-1"]
    before = len(shadow.requests)
    assert call("reviews", "/mirror/one")[1] == "reviews-v1"
    mirrored = eventually(lambda: shadow.requests[before:], what="mirrored request")
    assert mirrored[0]["path"] == "/mirror/one"
    # The copy keeps the original authority: istiod turns off Envoy's "-shadow" suffix.
    assert {k.lower(): v for k, v in mirrored[0]["headers"].items()}["host"] == "reviews"
    # Requests outside the mirrored route are not copied.
    call("reviews", "/plain")
    time.sleep(0.3)
    assert all(r["path"] != "/plain" for r in shadow.requests)


def test_retries_recover_from_a_failing_endpoint(traffic):
    with_retries = Counter(call("flaky", "/retry")[0] for _ in range(40))
    assert with_retries == Counter({200: 40})
    # The same backends without retries: the failing endpoint's 503s reach the client.
    without = Counter(call("flaky", "/none")[0] for _ in range(40))
    assert without[503] > 0 and without[200] > 0, without


def test_per_try_timeout_fires_and_route_timeout_returns_504(traffic):
    slow = traffic["slow-1"]
    before = len(slow.requests)
    start = time.monotonic()
    status, _, _, _ = call("slow", "/pertry")
    elapsed = time.monotonic() - start
    # Three tries of 0.3 s each, each cut before the backend's 1 s answer (a 504, not its 200); the
    # upper bound leaves a busy host a second, and still refuses tries of 0.6 s or more.
    assert status == 504
    assert 0.8 <= elapsed < 2, elapsed
    eventually(lambda: len(slow.requests) - before == 3, what="three attempts")
    start = time.monotonic()
    status, _, _, _ = call("slow", "/whole")
    elapsed = time.monotonic() - start
    assert status == 504
    assert 0.4 <= elapsed < 1.5, elapsed


def test_consistent_hash_keeps_a_key_on_one_backend(traffic):
    for key in ("alice", "bob", "carol"):
        assert len(names("hashed", "/", 15, {"x-key": key})) == 1
    spread = {call("hashed", "/", {"x-key": f"user-{i}"})[1] for i in range(30)}
    assert len(spread) >= 2, spread


def test_cookie_hash_sets_a_cookie_and_keeps_affinity(traffic):
    status, first, headers, _ = call("cookie", "/")
    assert status == 200
    cookie = headers.get("set-cookie", "")
    assert cookie.startswith("affinity="), headers
    assert "Max-Age=60" in cookie
    value = cookie.split(";", 1)[0]
    assert names("cookie", "/", 15, {"Cookie": value}) == Counter({first: 15})


def test_delegate_virtual_service_routes_under_its_root(traffic):
    assert call("ratings", "/v2/stars")[1] == "reviews-v2"
    assert call("ratings", "/v1/stars")[1] == "ratings-1"
    # Outside the root's match nothing routes.
    assert call("ratings", "/other")[0] == 404


def test_cors_preflight_is_answered_for_allowed_origins_only(traffic):
    preflight = {
        "Origin": "https://shop.example",
        "Access-Control-Request-Method": "PUT",
        "Access-Control-Request-Headers": "x-token",
    }
    v1 = traffic["reviews-v1"]
    before = len(v1.requests)
    status, _, headers, _ = call("reviews", "/cors", preflight, method="OPTIONS")
    # Envoy answers the preflight itself; the backend never sees it.
    assert status == 200
    assert headers.get("access-control-allow-origin") == "https://shop.example"
    assert "PUT" in headers.get("access-control-allow-methods", "")
    assert headers.get("access-control-max-age") == "600"
    assert not any(r["method"] == "OPTIONS" for r in v1.requests[before:])
    # A simple request from an allowed origin gets the header; another origin does not.
    _, _, allowed, _ = call("reviews", "/cors", {"Origin": "https://shop.example"})
    assert allowed.get("access-control-allow-origin") == "https://shop.example"
    _, _, other, _ = call("reviews", "/cors", {"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other
