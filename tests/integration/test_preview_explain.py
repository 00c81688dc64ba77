"""Change preview and push explanation against a meshpilot process, with real ADS clients.

For several golden cases a meshpilot process serves a copy of the case's files; clients of both
protocols subscribe as Envoy does; ``POST /debug/preview`` (and ``meshpilot preview``) is asked about
a change; the change is then written into the config directory and what each client receives is
recorded. The preview's proxies and resources must be exactly what the push sent. Then
``/debug/explain`` (and ``meshpilot explain``) must name that change as the trigger of the proxy's
last push, with why it concerned the proxy, and trace a cluster and a route back to their
DestinationRule and VirtualServices; for a gateway (a ``router`` client), the Gateway that selects
it and the VirtualService bound to it.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.ads_recorder import Recorder
from support.golden import agent_metadata
from support.kube import write
from support.processes import Meshpilot

CASES = Path(__file__).parents[1] / "golden" / "cases"


@dataclass(frozen=True)
class Client:
    node_id: str
    labels: dict[str, str]
    delta: bool

    @property
    def proxy(self) -> str:
        return self.node_id.split("~")[2]


@dataclass(frozen=True)
class Scenario:
    case: str
    clients: tuple[Client, ...]
    #: The case's object to change (kind, name) and how; or a new object.
    change: list[dict[str, Any]]
    #: Proxies that must be pushed, and those that must not (so the comparison cannot be empty).
    pushed: frozenset[str]
    not_pushed: frozenset[str] = field(default_factory=frozenset)


def _object(case: str, kind: str, name: str) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all((CASES / case / "config.yaml").read_text()) if d]
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def _reviews_rule() -> list[dict[str, Any]]:
    rule = _object("http-routing", "DestinationRule", "reviews")
    rule["spec"]["trafficPolicy"]["connectionPool"]["tcp"]["maxConnections"] = 250
    return [rule]


def _refunds_rule() -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "networking.istio.io/v1",
            "kind": "DestinationRule",
            "metadata": {"name": "refunds", "namespace": "payments"},
            "spec": {
                "host": "refunds.payments.svc.cluster.local",
                "trafficPolicy": {"connectionPool": {"tcp": {"maxConnections": 7}}},
            },
        }
    ]


def _db_endpoint() -> list[dict[str, Any]]:
    entry = _object("service-entries", "ServiceEntry", "static-db")
    entry["spec"]["endpoints"].append({"address": "10.2.0.3", "labels": {"version": "v3"}})
    return [entry]


def _allow_put() -> list[dict[str, Any]]:
    policy = _object("authz-deny-allow", "AuthorizationPolicy", "allow-client")
    policy["spec"]["rules"][0]["to"][0]["operation"]["methods"].append("PUT")
    return [policy]


def _bookinfo_timeout() -> list[dict[str, Any]]:
    """The gateway's VirtualService with its first route's timeout changed from 5s to 7s."""
    vs = _object("gateway", "VirtualService", "bookinfo")
    vs["spec"]["http"][0]["timeout"] = "7s"
    return [vs]


def _sidecar(ip: str, pod: str, ns: str, labels: dict[str, str], *, delta: bool) -> Client:
    return Client(f"sidecar~{ip}~{pod}.{ns}~{ns}.svc.cluster.local", labels, delta)


INGRESS = Client(
    "router~10.1.0.100~gw-1.istio-system~istio-system.svc.cluster.local", {"istio": "ingressgateway"}, False
)


SCENARIOS = [
    Scenario(
        "http-routing",
        (
            _sidecar(
                "10.1.0.10", "productpage-v1", "default", {"app": "productpage", "version": "v1"}, delta=True
            ),
            _sidecar("10.1.0.21", "reviews-v1", "default", {"app": "reviews", "version": "v1"}, delta=False),
            _sidecar("10.1.0.31", "ratings-v1", "default", {"app": "ratings", "version": "v1"}, delta=True),
        ),
        _reviews_rule(),
        frozenset({"productpage-v1.default", "reviews-v1.default", "ratings-v1.default"}),
    ),
    Scenario(
        "sidecar-scoping",
        (
            _sidecar("10.1.1.10", "cart-1", "shop", {"app": "cart"}, delta=True),
            _sidecar("10.1.1.20", "checkout-1", "shop", {"app": "checkout"}, delta=False),
            _sidecar("10.1.2.10", "charge-1", "payments", {"app": "charge"}, delta=True),
        ),
        _refunds_rule(),
        frozenset({"checkout-1.shop", "charge-1.payments"}),
        frozenset({"cart-1.shop"}),
    ),
    Scenario(
        "service-entries",
        (
            _sidecar("10.1.0.50", "client", "default", {"app": "client"}, delta=True),
            _sidecar("10.1.0.51", "other", "default", {"app": "other"}, delta=False),
        ),
        _db_endpoint(),
        frozenset({"client.default", "other.default"}),
    ),
    Scenario(
        "authz-deny-allow",
        (
            _sidecar("10.1.0.51", "api-1", "default", {"app": "api", "version": "v1"}, delta=True),
            _sidecar("10.1.0.61", "client-1", "default", {"app": "client"}, delta=False),
        ),
        _allow_put(),
        frozenset({"api-1.default"}),
        frozenset({"client-1.default"}),
    ),
    # A VirtualService bound to a Gateway only: the gateway is pushed, the sidecar is not.
    Scenario(
        "gateway",
        (INGRESS, _sidecar("10.1.0.21", "reviews-v1", "default", {"app": "reviews"}, delta=True)),
        _bookinfo_timeout(),
        frozenset({"gw-1.istio-system"}),
        frozenset({"reviews-v1.default"}),
    ),
]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
async def served(workdir: Path, request: pytest.FixtureRequest) -> AsyncIterator[tuple[Meshpilot, Path]]:
    # A case, or (a case, push workers): the preview runs in the main process, over the workers'
    # connections then.
    case, workers = request.param if isinstance(request.param, tuple) else (request.param, 1)
    config = workdir / "config"
    config.mkdir()
    shutil.copy(CASES / case / "config.yaml", config / "config.yaml")
    mesh = CASES / case / "mesh.yaml"
    mp = Meshpilot(
        workdir,
        config,
        mesh_config=mesh if mesh.exists() else None,
        extra=["--push-workers", str(workers)],
    )
    mp.start()
    try:
        await asyncio.to_thread(mp.wait_ready)
        yield mp, config
    finally:
        mp.stop()


def _post(mp: Meshpilot, path: str, body: bytes) -> dict[str, Any]:
    url = f"http://127.0.0.1:{mp.monitoring_port}{path}"
    request = urllib.request.Request(url, data=body, method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        result: dict[str, Any] = json.loads(response.read())
    return result


def _get(mp: Meshpilot, path: str, **query: str) -> dict[str, Any]:
    url = f"http://127.0.0.1:{mp.monitoring_port}{path}?{urllib.parse.urlencode(query)}"
    with urllib.request.urlopen(url, timeout=30) as response:
        result: dict[str, Any] = json.loads(response.read())
    return result


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "meshpilot.cli.main", *args], capture_output=True, text=True, timeout=120
    )


async def _connect(mp: Meshpilot, clients: tuple[Client, ...]) -> list[Recorder]:
    out = []
    for client in clients:
        recorder = Recorder(
            f"127.0.0.1:{mp.grpc_port}",
            client.node_id,
            agent_metadata(client.node_id, {"LABELS": client.labels}),
            delta=client.delta,
        )
        await recorder.subscribe()
        out.append(recorder)
    return out


@pytest.mark.parametrize(
    ("served", "scenario"),
    [
        *(pytest.param(s.case, s, id=s.case) for s in SCENARIOS),
        pytest.param((SCENARIOS[0].case, 2), SCENARIOS[0], id=f"{SCENARIOS[0].case}-2-workers"),
    ],
    indirect=["served"],
)
async def test_the_preview_is_what_the_push_then_sends(
    served: tuple[Meshpilot, Path], scenario: Scenario
) -> None:
    mp, config = served
    recorders = await _connect(mp, scenario.clients)
    try:
        body = yaml.safe_dump_all(scenario.change).encode()
        result = await asyncio.to_thread(_post, mp, "/debug/preview", body)
        assert result["valid"], result["errors"]
        assert result["proxies"]["considered"] == len(scenario.clients)
        predicted = {
            p["proxy"]: {(r["type"], r["name"], r["change"]) for r in p["resources"]}
            for p in result["pushes"]
        }
        warming = {p["proxy"]: set(p.get("warming", ())) for p in result["pushes"]}
        assert set(predicted) == scenario.pushed
        assert not result["unscoped"], result["unscoped"]
        # The live server did not move: a second preview of the same change says the same.
        again = await asyncio.to_thread(_post, mp, "/debug/preview", body)
        assert again["pushes"] == result["pushes"]

        write(config / "change.yaml", scenario.change)
        by_proxy = {r.node[0].split("~")[2]: r for r in recorders}
        seen: dict[str, set[tuple[str, str, str]]] = {}
        resent: dict[str, set[str]] = {}
        # Those that must be pushed first (waiting for the push), then the others: what the same
        # push sent them is waiting in their streams.
        for proxy in sorted(by_proxy, key=lambda p: p not in scenario.pushed):
            first = 15.0 if proxy in scenario.pushed else 1.0
            changed, same, _ = await by_proxy[proxy].record(quiet=1.0, first=first)
            if changed:
                seen[proxy] = changed
            if same:
                resent[proxy] = {name for _, name, _ in same}
        assert seen == predicted
        for proxy in scenario.not_pushed:
            assert proxy not in seen
        # A delta stream resends the endpoints of a changed cluster (Envoy warms it): predicted too.
        for client in scenario.clients:
            if client.delta:
                assert resent.get(client.proxy, set()) == warming.get(client.proxy, set()), client.proxy
    finally:
        for recorder in recorders:
            await recorder.close()


@pytest.mark.parametrize("served", ["http-routing"], indirect=True)
async def test_explain_names_the_trigger_and_the_objects_behind_resources(
    served: tuple[Meshpilot, Path],
) -> None:
    mp, config = served
    clients = SCENARIOS[0].clients
    recorders = await _connect(mp, clients)
    try:
        change = _reviews_rule()
        files = config.parent / "change-input.yaml"
        files.write_text(yaml.safe_dump_all(change))
        server = f"http://127.0.0.1:{mp.monitoring_port}"
        shown = await asyncio.to_thread(_cli, "preview", "-f", str(files), "--server", server)
        assert shown.returncode == 0, shown.stderr
        assert "update    DestinationRule default/reviews" in shown.stdout
        assert "3 of 3 connected proxies would be pushed" in shown.stdout
        assert "changed  cds outbound|9080|v2|reviews.default.svc.cluster.local" in shown.stdout
        assert '-        "max_connections": 100,' in shown.stdout
        assert '+        "max_connections": 250,' in shown.stdout
        bad = config.parent / "bad.yaml"
        broken = _reviews_rule()[0]
        broken["spec"]["trafficPolicy"]["loadBalancer"] = {"simple": "NO_SUCH_POLICY"}
        bad.write_text(yaml.safe_dump(broken))
        refused = await asyncio.to_thread(_cli, "preview", "-f", str(bad), "--server", server)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "error: DestinationRule default/reviews:" in refused.stdout
        assert "nothing would be applied" in refused.stdout
        # Each distinct diff once, though three proxies would get the same clusters.
        assert shown.stdout.count("+++ cds/outbound|9080|v2|reviews.default.svc.cluster.local") == 1

        write(config / "change.yaml", change)
        for recorder in recorders:
            await recorder.record(quiet=1.0, first=15.0)

        explained = await asyncio.to_thread(_get, mp, "/debug/explain", proxyID="productpage-v1.default")
        assert explained["connected"] is True
        assert explained["scope"] == "the default scope of namespace default (no Sidecar selects it)"
        last = explained["pushes"][0]
        assert last["full"] is True
        (trigger,) = last["changes"]
        assert (trigger["kind"], trigger["namespace"], trigger["name"], trigger["change"]) == (
            "DestinationRule",
            "default",
            "reviews",
            "update",
        )
        assert trigger["concerns"] is True
        assert "DestinationRule default/reviews applies" in trigger["why"]
        assert "reviews.default.svc.cluster.local" in trigger["why"]
        sent = {s["type"]: s for s in last["sent"]}
        assert "outbound|9080|v2|reviews.default.svc.cluster.local" in sent["cds"]["names"]
        assert last["bytes"] > 0 and last["bytes"] == sum(s["bytes"] for s in last["sent"])

        cluster = await asyncio.to_thread(
            _get,
            mp,
            "/debug/explain",
            proxyID="productpage-v1.default",
            resource="cds/outbound|9080|v3|reviews.default.svc.cluster.local",
        )
        assert cluster["service"]["name"] == "reviews"
        assert cluster["service"]["registry"] == "Kubernetes"
        assert cluster["destinationRules"] == ["DestinationRule default/reviews"]
        assert cluster["subset"] == {"name": "v3", "from": "DestinationRule default/reviews"}
        route = await asyncio.to_thread(
            _get, mp, "/debug/explain", proxyID="productpage-v1.default", resource="rds/9080"
        )
        assert {vs["name"] for vs in route["virtualServices"]} == {"default/reviews", "default/ratings-root"}
        assert {s["name"] for s in route["services"]} == {"productpage", "reviews", "ratings"}
        # Both rules hash (ratings on a header, reviews' subset v3 on a cookie): their hash policies
        # are in this route configuration.
        assert route["destinationRules"] == ["default/ratings", "default/reviews"]
        inbound = await asyncio.to_thread(
            _get, mp, "/debug/explain", proxyID="productpage-v1.default", resource="lds/virtualInbound"
        )
        assert [s["name"] for s in inbound["services"]] == ["productpage"]
        endpoints = await asyncio.to_thread(
            _get,
            mp,
            "/debug/explain",
            proxyID="productpage-v1.default",
            resource="eds/outbound|9080|v2|reviews.default.svc.cluster.local",
        )
        assert endpoints["subset"] == {"name": "v2", "labels": {"version": "v2"}}
        assert [s["endpoints"] for s in endpoints["sources"]] == [3]

        told = await asyncio.to_thread(
            _cli, "explain", "--proxy", "productpage-v1.default", "--server", server
        )
        assert told.returncode == 0, told.stderr
        assert "update DestinationRule default/reviews: the default scope of namespace default" in told.stdout
        assert "sent cds (" in told.stdout
    finally:
        for recorder in recorders:
            await recorder.close()


@pytest.mark.parametrize("served", ["sidecar-scoping"], indirect=True)
async def test_explain_says_why_a_scoped_proxy_was_left_out(served: tuple[Meshpilot, Path]) -> None:
    mp, config = served
    clients = SCENARIOS[1].clients
    recorders = await _connect(mp, clients)
    try:
        write(config / "change.yaml", _refunds_rule())
        for recorder in recorders:
            await recorder.record(quiet=1.0, first=15.0 if recorder.node[0] != clients[0].node_id else 2.0)
        checkout = await asyncio.to_thread(_get, mp, "/debug/explain", proxyID="checkout-1.shop")
        (trigger,) = checkout["pushes"][0]["changes"]
        assert trigger["name"] == "refunds" and trigger["concerns"] is True
        assert trigger["why"].startswith("the default scope of namespace shop")
        assert "refunds.payments.svc.cluster.local" in trigger["why"]
        cart = await asyncio.to_thread(_get, mp, "/debug/explain", proxyID="cart-1.shop")
        assert cart["scope"] == "Sidecar shop/cart"
        # Its last push is the one that connected it; the refunds rule never reached it.
        names = {(c["kind"], c["name"]) for p in cart["pushes"] for c in p["changes"]}
        assert ("DestinationRule", "refunds") not in names
        listed = await asyncio.to_thread(
            _get,
            mp,
            "/debug/explain",
            proxyID="cart-1.shop",
            resource="cds/outbound|80||charge.payments.svc.cluster.local",
        )
        assert listed["service"]["namespace"] == "payments"
    finally:
        for recorder in recorders:
            await recorder.close()


@pytest.mark.parametrize("served", ["gateway"], indirect=True)
async def test_explain_traces_a_gateway_push_and_its_route(served: tuple[Meshpilot, Path]) -> None:
    mp, config = served
    (gateway,) = recorders = await _connect(mp, (INGRESS,))
    try:
        write(config / "change.yaml", _bookinfo_timeout())
        changed, _, _ = await gateway.record(quiet=1.0, first=15.0)
        assert changed == {("rds", "http.8080", "changed")}

        explained = await asyncio.to_thread(_get, mp, "/debug/explain", proxyID="gw-1.istio-system")
        assert explained["connected"] is True
        assert explained["scope"] == "the default scope of namespace istio-system (gateways take no Sidecar)"
        assert explained["gateways"] == [
            {"name": "default/bookinfo-gateway", "selector": {"istio": "ingressgateway"}, "ports": [80]}
        ]
        last = explained["pushes"][0]
        (trigger,) = last["changes"]
        assert (trigger["kind"], trigger["namespace"], trigger["name"], trigger["change"]) == (
            "VirtualService",
            "default",
            "bookinfo",
            "update",
        )
        assert trigger["concerns"] is True
        assert trigger["why"] == (
            "VirtualService default/bookinfo (gateways: bookinfo-gateway) serves bookinfo.example.com, "
            "cart.shop.example.com on port 80 of Gateway default/bookinfo-gateway (route http.8080)"
        )
        sent = {s["type"]: s for s in last["sent"]}
        assert sent["rds"]["names"] == ["http.8080"]

        route = await asyncio.to_thread(
            _get, mp, "/debug/explain", proxyID="gw-1.istio-system", resource="rds/http.8080"
        )
        assert [(s["gateway"], s["port"], s["listenPort"]) for s in route["servers"]] == [
            ("default/bookinfo-gateway", 80, 8080)
        ]
        assert [(vs["name"], vs["hosts"]) for vs in route["virtualServices"]] == [
            ("default/bookinfo", ["bookinfo.example.com", "cart.shop.example.com"])
        ]
        listener = await asyncio.to_thread(
            _get, mp, "/debug/explain", proxyID="gw-1.istio-system", resource="lds/0.0.0.0_8080"
        )
        assert [s["route"] for s in listener["servers"]] == ["http.8080"]

        server = f"http://127.0.0.1:{mp.monitoring_port}"
        told = await asyncio.to_thread(_cli, "explain", "--proxy", "gw-1.istio-system", "--server", server)
        assert told.returncode == 0, told.stderr
        assert "selected by Gateway default/bookinfo-gateway (istio=ingressgateway; ports 80)" in told.stdout
        assert "update VirtualService default/bookinfo: VirtualService default/bookinfo" in told.stdout
        assert "sent rds (1, " in told.stdout
    finally:
        for recorder in recorders:
            await recorder.close()
