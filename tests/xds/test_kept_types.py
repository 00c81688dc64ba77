"""What a push of VirtualServices alone leaves of a sidecar's clusters and listeners
(``xds.dependencies.clusters_kept``, ``listeners_kept``): each case makes a change, builds the
snapshot after it and asks the generators; a type said to be kept must build the same bytes as
before, and most cases that refuse to keep a type do so because its output did change. Then a real
server and a client of each protocol (``Stream._keep``): the push builds routes only; a type the
push before did not build, or failed to, is built again."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.route.v3 import route_pb2
from envoy.service.discovery.v3 import discovery_pb2
from support.ads_client import AdsClient, DeltaClient
from support.kube import istio, workload, write
from support.model import Model, build
from support.xds_server import NODE, Server, three_services

from meshpilot.model.config import ConfigKey
from meshpilot.model.kind import Kind
from meshpilot.model.proxy import Proxy
from meshpilot.model.push_context import PushContext
from meshpilot.model.push_request import PushRequest, TriggerReason
from meshpilot.xds import dependencies
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.generators.base import GenerationContext
from meshpilot.xds.generators.cds import ClusterGenerator
from meshpilot.xds.generators.lds import ListenerGenerator
from meshpilot.xds.generators.rds import RouteGenerator
from meshpilot.xds.types import TypeUrl

WEB = "sidecar~10.1.0.52~web-0.default~default.svc.cluster.local"
# Sees its own namespace only (a Sidecar), and what its VirtualServices route to.
LONER = "sidecar~10.1.0.61~loner-0.other~other.svc.cluster.local"
GATEWAY = "router~10.1.0.71~gw-0.istio-system~istio-system.svc.cluster.local"
API = "api.default.svc.cluster.local"
DB = "db.default.svc.cluster.local"
GENERATORS = {TypeUrl.CLUSTER: ClusterGenerator(), TypeUrl.LISTENER: ListenerGenerator()}


def mesh() -> list[dict[str, Any]]:
    return [
        *workload("api", "default", "10.96.0.50", 9080, {"api-0": "10.1.0.51"}),
        *workload("web", "default", "10.96.0.55", 8080, {"web-0": "10.1.0.52"}),
        *workload("db", "default", "10.96.0.57", 5432, {"db-0": "10.1.0.53"}, port_name="tcp"),
        *workload("loner", "other", "10.96.0.60", 8080, {"loner-0": "10.1.0.61"}),
        istio("Sidecar", "default", "other", {"egress": [{"hosts": ["./*"]}]}),
        http_routes("api-routes", "default", API, timeout="5s"),
        tcp_routes("db-routes", DB, 5432),
    ]


def http_routes(name: str, namespace: str, host: str, **route: Any) -> dict[str, Any]:
    return istio(
        "VirtualService",
        name,
        namespace,
        {"hosts": [host], "http": [{"route": [{"destination": {"host": host}}], **route}]},
    )


def tcp_routes(name: str, host: str, port: int) -> dict[str, Any]:
    return istio(
        "VirtualService",
        name,
        "default",
        {"hosts": [host], "tcp": [{"match": [{"port": port}], "route": [{"destination": {"host": host}}]}]},
    )


def generated(proxy: Proxy, push: PushContext, model: Model) -> dict[TypeUrl, list[tuple[str, bytes]]]:
    out = {}
    for type_url, generator in GENERATORS.items():
        ctx = GenerationContext(proxy, push, model.index, PushRequest(push=push))
        resources = generator.generate(ctx, WatchedResource(type_url.value, wildcard=True), None) or []
        out[type_url] = [(r.name, r.payload) for r in resources]
    return out


def pushed(
    model: Model,
    node: str,
    *docs: Mapping[str, Any],
    kinds: tuple[Kind, ...] = (),
    unnamed: Sequence[Mapping[str, Any]] = (),
) -> tuple[set[TypeUrl], dict[TypeUrl, bool]]:
    """Applies ``docs`` as one push would: the types kept for ``node``, and whether each type's
    output changed. ``unnamed`` objects change too, in the same snapshot, but the request does not
    name them (changes made after the requests were merged, whose own push comes next)."""
    proxy = model.proxy(node)
    before = generated(proxy, model.push, model)
    for doc in (*docs, *unnamed):
        model.upsert(doc)
    keys = {ConfigKey(Kind.VIRTUAL_SERVICE, d["metadata"]["name"], d["metadata"]["namespace"]) for d in docs}
    keys |= {ConfigKey(kind, "any", "default") for kind in kinds}
    model.push = model.env.build_push_context("test/2")
    request = PushRequest(
        full=True,
        configs_updated=frozenset(keys),
        reasons=Counter({TriggerReason.CONFIG: 1}),
        push=model.push,
    )
    model.env.refresh_proxy(proxy, model.push)
    assert proxy.previous_scope is not None
    kept = {t for t, g in GENERATORS.items() if g.kept_for(proxy, request)}
    after = generated(proxy, model.push, model)
    return kept, {t: before[t] != after[t] for t in GENERATORS}


@pytest.fixture
def model() -> Model:
    return build(mesh())


def test_an_http_route_change_keeps_clusters_and_listeners(model: Model) -> None:
    kept, changed = pushed(model, WEB, http_routes("api-routes", "default", API, timeout="9s"))
    assert kept == {TypeUrl.CLUSTER, TypeUrl.LISTENER}
    assert not any(changed.values())


def test_a_new_http_virtual_service_keeps_both(model: Model) -> None:
    kept, changed = pushed(model, WEB, http_routes("web-routes", "default", "web.default.svc.cluster.local"))
    assert kept == {TypeUrl.CLUSTER, TypeUrl.LISTENER}
    assert not any(changed.values())


def test_a_tcp_route_change_builds_listeners_again(model: Model) -> None:
    moved = tcp_routes("db-routes", DB, 5432)
    moved["spec"]["tcp"][0]["route"][0]["destination"]["host"] = API
    kept, changed = pushed(model, WEB, moved)
    assert kept == {TypeUrl.CLUSTER}
    assert changed[TypeUrl.LISTENER], "the tcp chain routes to api now"
    assert not changed[TypeUrl.CLUSTER]


def test_a_tcp_route_removed_builds_listeners_again(model: Model) -> None:
    # The VirtualService keeps its name but loses its tcp routes: only the scope before had them.
    emptied = http_routes("db-routes", "default", DB)
    kept, changed = pushed(model, WEB, emptied)
    assert kept == {TypeUrl.CLUSTER}
    assert changed[TypeUrl.LISTENER]


def test_a_destination_that_imports_a_service_keeps_nothing(model: Model) -> None:
    # loner's Sidecar sees only its namespace; a VirtualService there routing to api brings api in.
    kept, changed = pushed(model, LONER, http_routes("to-api", "other", API))
    assert kept == set()
    assert changed[TypeUrl.CLUSTER], "api's cluster is new"


def test_a_sidecar_scope_keeps_clusters_only(model: Model) -> None:
    kept, changed = pushed(
        model, LONER, http_routes("loner-routes", "other", "loner.other.svc.cluster.local")
    )
    assert kept == {TypeUrl.CLUSTER}
    assert not changed[TypeUrl.CLUSTER]


def test_a_tcp_route_change_the_request_does_not_name_builds_listeners_again(model: Model) -> None:
    moved = tcp_routes("db-routes", DB, 5432)
    moved["spec"]["tcp"][0]["route"][0]["destination"]["host"] = API
    named = http_routes("api-routes", "default", API, timeout="9s")
    kept, changed = pushed(model, WEB, named, unnamed=[moved])
    assert kept == {TypeUrl.CLUSTER}
    assert changed[TypeUrl.LISTENER]


def test_another_kind_the_request_does_not_name_keeps_nothing(model: Model) -> None:
    # Imports stay the same; the inferred mTLS mode of default's services does not.
    plaintext = istio(
        "PeerAuthentication", "default", "default", {"mtls": {"mode": "DISABLE"}}, group="security"
    )
    named = http_routes("api-routes", "default", API, timeout="9s")
    kept, changed = pushed(model, WEB, named, unnamed=[plaintext])
    assert kept == set()
    assert changed[TypeUrl.CLUSTER], "auto mTLS is off for api, web and db"


def test_a_workload_read_again_keeps_nothing(model: Model) -> None:
    relabelled = next(d for d in mesh() if d["kind"] == "Pod" and d["metadata"]["name"] == "web-0")
    relabelled["metadata"]["labels"] = {**relabelled["metadata"]["labels"], "tier": "front"}
    kept, _ = pushed(
        model, WEB, http_routes("api-routes", "default", API, timeout="9s"), unnamed=[relabelled]
    )
    assert kept == set()


DNS_SERVICE = istio(
    "ServiceEntry",
    "external",
    "default",
    {
        "hosts": ["api.example.com"],
        "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}],
        "resolution": "DNS",
        "location": "MESH_EXTERNAL",
    },
)
PASSTHROUGH_SUBSET = istio(
    "DestinationRule",
    "api",
    "default",
    {
        "host": API,
        "subsets": [
            {"name": "v1", "labels": {"v": "1"}, "trafficPolicy": {"loadBalancer": {"simple": "PASSTHROUGH"}}}
        ],
    },
)


@pytest.mark.parametrize(
    "reading",
    [
        # A headless service's inferred mTLS mode reads its endpoints, which change between full pushes.
        workload("store", "default", "None", 7000, {"store-0": "10.1.0.54"}),
        # So does a passthrough load balancer's, here a subset's.
        [PASSTHROUGH_SUBSET],
        # A DNS cluster carries its endpoints.
        [DNS_SERVICE],
    ],
    ids=["headless", "passthrough-subset", "dns"],
)
def test_clusters_that_read_endpoints_are_not_kept(reading: list[dict[str, Any]]) -> None:
    model = build([*mesh(), *reading])
    kept, _ = pushed(model, WEB, http_routes("api-routes", "default", API, timeout="9s"))
    assert kept == set()


@pytest.mark.parametrize("reads", [False, True], ids=["kept", "reading-endpoints"])
def test_a_scope_with_the_same_imports_takes_the_answer_of_the_one_before(
    reads: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether any cluster reads endpoints is worked out for a scope that imports something new,
    then carried to the next scopes that import the same (``dependencies._same_clusters``)."""
    model = build([*mesh(), *([PASSTHROUGH_SUBSET] if reads else [])])
    walked: list[str] = []
    original = dependencies.mode_reads_endpoints

    def counting(svc: Any, rule: Any) -> bool:
        walked.append(svc.hostname)
        return original(svc, rule)

    monkeypatch.setattr(dependencies, "mode_reads_endpoints", counting)
    for timeout in ("7s", "8s", "9s"):
        walked.clear()
        kept, _ = pushed(model, WEB, http_routes("api-routes", "default", API, timeout=timeout))
        assert kept == (set() if reads else {TypeUrl.CLUSTER, TypeUrl.LISTENER})
        if timeout == "7s":
            assert API in walked  # the first push's scope: nothing to take it from
        else:
            assert walked == []


def test_other_kinds_and_forced_pushes_keep_nothing(model: Model) -> None:
    kept, _ = pushed(
        model, WEB, http_routes("api-routes", "default", API, timeout="9s"), kinds=(Kind.DESTINATION_RULE,)
    )
    assert kept == set()
    proxy = model.proxy(WEB)
    model.env.refresh_proxy(proxy, model.push)
    forced = PushRequest(
        full=True, forced=True, configs_updated=frozenset({ConfigKey(Kind.VIRTUAL_SERVICE, "x", "default")})
    )
    assert not any(g.kept_for(proxy, forced) for g in GENERATORS.values())
    endpoints = PushRequest(
        full=False, configs_updated=frozenset({ConfigKey(Kind.VIRTUAL_SERVICE, "x", "default")})
    )
    assert not any(g.kept_for(proxy, endpoints) for g in GENERATORS.values())


def test_a_router_and_a_first_push_keep_nothing(model: Model) -> None:
    request = PushRequest(
        full=True, configs_updated=frozenset({ConfigKey(Kind.VIRTUAL_SERVICE, "api-routes", "default")})
    )
    gateway = model.proxy(GATEWAY, {"LABELS": {"istio": "ingressgateway"}})
    model.env.refresh_proxy(gateway, model.push)
    assert gateway.previous_scope is not None
    assert not any(g.kept_for(gateway, request) for g in GENERATORS.values())
    # Just connected: no scope before this one to compare with.
    web = model.proxy(WEB)
    assert web.previous_scope is None
    assert not any(g.kept_for(web, request) for g in GENERATORS.values())


CDS, LDS, RDS = TypeUrl.CLUSTER.value, TypeUrl.LISTENER.value, TypeUrl.ROUTE.value


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    async with three_services(tmp_path) as served:
        yield served


#: The names a state-of-the-world client watches of a non-wildcard type, sent again with each ACK.
WATCHED = {RDS: ["9080"]}


def client_for(server: Server, protocol: str) -> AdsClient | DeltaClient:
    return server.delta_client() if protocol == "delta" else server.client()


def resource_names(response: Any) -> list[str]:
    """The names a response carries: delta names each resource; state-of-the-world's are in them."""
    if isinstance(response, discovery_pb2.DeltaDiscoveryResponse):
        return [r.name for r in response.resources]
    if response.type_url == CDS:
        return [cluster_pb2.Cluster.FromString(r.value).name for r in response.resources]
    return [route_pb2.RouteConfiguration.FromString(r.value).name for r in response.resources]


def ack(client: AdsClient | DeltaClient, response: Any) -> None:
    if isinstance(client, DeltaClient):
        client.ack(response)
    else:
        client.ack(response, WATCHED.get(response.type_url))


async def drained(client: AdsClient | DeltaClient, first: float = 10.0, gap: float = 1.0) -> dict[str, Any]:
    """The responses that come, ACKed, by type: the first within ``first`` seconds (a file change goes
    through the loader and the debounce), then each within ``gap`` of the one before, at most eight."""
    by_type = {}
    for i in range(8):
        try:
            response = await client.recv(first if i == 0 else gap)
        except TimeoutError:
            break
        by_type[response.type_url] = response
        ack(client, response)
    return by_type


def reviews_routes(timeout: str) -> dict[str, Any]:
    return istio(
        "VirtualService",
        "reviews",
        "default",
        {
            "hosts": ["reviews"],
            "http": [{"timeout": timeout, "route": [{"destination": {"host": "reviews"}}]}],
        },
    )


@pytest.mark.parametrize("protocol", ["delta", "sotw"])
async def test_a_virtual_service_push_builds_routes_only(
    server: Server, monkeypatch: pytest.MonkeyPatch, protocol: str
) -> None:
    client = client_for(server, protocol)
    for type_url in (CDS, LDS, RDS):
        client.send(type_url, WATCHED.get(type_url), node_id=NODE if type_url == CDS else None)
        response = await client.recv()
        assert response.type_url == type_url
        ack(client, response)
    assert await client.no_response(0.3)

    built: list[TypeUrl] = []
    failing: set[TypeUrl] = set()
    failed = asyncio.Event()
    for cls in (ClusterGenerator, ListenerGenerator):
        original = cls.generate

        def counting(self: Any, *args: Any, original: Any = original) -> Any:
            built.append(self.type_url)
            if self.type_url in failing:
                failed.set()
                raise RuntimeError("a bug in the cluster builder")
            return original(self, *args)

        monkeypatch.setattr(cls, "generate", counting)
    skipped = {t: server.metric("meshpilot_xds_unchanged_skipped_total", type=t) for t in ("cds", "lds")}
    write(server.config_dir / "vs.yaml", [reviews_routes("3s")])
    pushed = await drained(client)
    assert list(pushed) == [RDS] and resource_names(pushed[RDS]) == ["9080"]
    # What shows the keep: a type built and found unchanged is not sent either, and counted alike.
    assert built == [], "clusters and listeners were not built again"
    for short, before in skipped.items():
        assert server.metric("meshpilot_xds_unchanged_skipped_total", type=short) == before + 1

    # A push that builds listeners but not clusters (an AuthorizationPolicy): what the proxy holds
    # of clusters was built for the scope before it, so the next VirtualService push builds them.
    policy = istio(
        "AuthorizationPolicy", "allow-all", "default", {"action": "ALLOW", "rules": [{}]}, group="security"
    )
    write(server.config_dir / "policy.yaml", [policy])
    # Listeners are built; whether they come out changed is the policy's business, not this test's.
    for _ in range(200):
        if built:
            break
        await asyncio.sleep(0.05)
    await drained(client, first=1)
    assert built == [TypeUrl.LISTENER]
    built.clear()
    write(server.config_dir / "vs.yaml", [reviews_routes("4s")])
    assert list(await drained(client)) == [RDS]
    assert built == [TypeUrl.CLUSTER]

    # A DestinationRule with subsets, whose clusters fail to build: the next VirtualService push
    # builds them again (the proxy does not hold them) and sends the new ones.
    failing.add(TypeUrl.CLUSTER)
    rule = istio(
        "DestinationRule",
        "reviews",
        "default",
        {"host": "reviews", "subsets": [{"name": "v1", "labels": {"version": "v1"}}]},
    )
    write(server.config_dir / "dr.yaml", [rule])
    await asyncio.wait_for(failed.wait(), 10)
    assert CDS not in await drained(client, first=1)
    failing.clear()
    write(server.config_dir / "vs.yaml", [reviews_routes("5s")])
    pushed = await drained(client)
    assert "outbound|9080|v1|reviews.default.svc.cluster.local" in resource_names(pushed[CDS])
    await client.close()


async def test_proxies_alike_share_the_answers(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether a push keeps a type, and whether a type needs it at all, is asked once per push for the
    proxies alike in what the answer reads (``KeepsUnchanged``, ``needs_push``), not once per proxy;
    each proxy still gets the answer of its own scope."""
    nodes = {
        "default": NODE,
        "default-2": "sidecar~127.0.0.21~reviews-v1.default~default.svc.cluster.local",
        "other": "sidecar~127.0.0.41~other-0.other~other.svc.cluster.local",
    }
    clients = {}
    for name, node in nodes.items():
        client = clients[name] = server.delta_client()
        for type_url in (CDS, LDS, RDS):
            first = type_url == CDS
            namespace = node.split("~")[2].split(".")[1]
            metadata = {"NAMESPACE": namespace, "ISTIO_VERSION": "1.28.0", "INTERCEPTION_MODE": "NONE"}
            client.send(
                type_url,
                WATCHED.get(type_url),
                node_id=node if first else None,
                node_metadata=metadata if first else None,
            )
            response = await client.recv()
            assert response.type_url == type_url
            client.ack(response)
    for client in clients.values():
        assert await client.no_response(0.3)

    asked: Counter[tuple[str, str]] = Counter()
    for cls in (ClusterGenerator, ListenerGenerator):
        original = cls.kept_for

        def counting(self: Any, proxy: Proxy, request: PushRequest, original: Any = original) -> bool:
            asked[(self.type_url.short, proxy.config_namespace)] += 1
            return bool(original(self, proxy, request))

        monkeypatch.setattr(cls, "kept_for", counting)
    needs: Counter[str] = Counter()
    original_needs = RouteGenerator.needs_push

    def counting_needs(self: Any, request: PushRequest) -> bool:
        needs[self.type_url.short] += 1
        return bool(original_needs(self, request))

    monkeypatch.setattr(RouteGenerator, "needs_push", counting_needs)
    write(server.config_dir / "vs.yaml", [reviews_routes("3s")])
    for name, client in clients.items():
        assert list(await drained(client)) == [RDS], name
    # One scope for the two proxies of "default", another for "other".
    assert asked == {("cds", "default"): 1, ("lds", "default"): 1, ("cds", "other"): 1, ("lds", "other"): 1}
    assert needs == {"rds": 1}
    for client in clients.values():
        await client.close()
