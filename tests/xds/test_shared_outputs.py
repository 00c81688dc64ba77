"""Outbound clusters and listeners, and routes' cache parts, shared by the scopes of a snapshot that
import the same.

A full push builds a scope's outbound clusters and listeners once; scopes of other namespaces with
the same imports (the same service objects, in the same order, with DestinationRules of the same
fingerprint) reuse them (``generators.base.shared_token``); listeners compare more (``lds``). These
tests check both sides: what is the same is built once, and what differs by namespace (a rule
exported to its own namespace, a Sidecar, a route matching on the source namespace, a
VirtualService exported to its own namespace) is never handed to another namespace.
"""

from __future__ import annotations

from typing import Any

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from google.protobuf import any_pb2
from support.kube import istio, service
from support.mesh_objects import CLIENT, mesh_objects
from support.model import Model, build

from meshpilot.model.config import ConfigKey
from meshpilot.model.kind import Kind
from meshpilot.model.proxy import Proxy
from meshpilot.model.push_request import PushRequest
from meshpilot.xds.cache import XdsCache
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.generators import lds, rds
from meshpilot.xds.generators.base import GenerationContext
from meshpilot.xds.generators.cds import ClusterGenerator
from meshpilot.xds.generators.rds import RouteGenerator
from meshpilot.xds.types import TypeUrl

OTHER = "sidecar~10.1.0.31~ratings-v1.other~other.svc.cluster.local"
DB_LISTENER = "10.96.0.40_3306"
RATINGS = "outbound|9080||ratings.other.svc.cluster.local"
EXTERNAL = "outbound|443||api.example.com"


class CountingGenerator(ClusterGenerator):
    """Counts the outbound lists built (one per import signature, capabilities and DNS view)."""

    def __init__(self) -> None:
        self.built = 0

    def _outbound(self, ctx: GenerationContext) -> Any:
        self.built += 1
        return super()._outbound(ctx)


def outbound(generator: ClusterGenerator, model: Model, proxy: Proxy) -> dict[str, bytes]:
    ctx = GenerationContext(proxy, model.push, model.index, PushRequest(push=model.push))
    resources = generator.generate(ctx, WatchedResource(TypeUrl.CLUSTER.value), None) or []
    return {r.name: r.payload for r in resources if r.name.startswith("outbound|")}


def unpacked(payload: bytes) -> Any:
    wrapped = any_pb2.Any.FromString(payload)
    cluster = cluster_pb2.Cluster()
    wrapped.Unpack(cluster)
    return cluster


def test_namespaces_importing_the_same_share_one_build() -> None:
    model = build(mesh_objects())
    generator = CountingGenerator()
    here = outbound(generator, model, model.proxy(CLIENT))
    there = outbound(generator, model, model.proxy(OTHER))
    assert generator.built == 1
    assert there == here
    # The shared list is what the other namespace's proxy gets when it is built first, alone.
    alone = build(mesh_objects())
    assert outbound(CountingGenerator(), alone, alone.proxy(OTHER)) == there


def test_a_rule_exported_to_its_own_namespace_keeps_that_namespace_apart() -> None:
    rule = istio(
        "DestinationRule",
        "ratings-local",
        "other",
        {
            "host": "ratings",
            "exportTo": ["."],
            "trafficPolicy": {"connectionPool": {"tcp": {"maxConnections": 7}}},
        },
    )
    model = build([*mesh_objects(), rule])
    generator = CountingGenerator()
    # The namespace that does not see the rule goes first: a wrong share would hand its list on.
    here = outbound(generator, model, model.proxy(CLIENT))
    there = outbound(generator, model, model.proxy(OTHER))
    assert generator.built == 2
    assert unpacked(there[RATINGS]).circuit_breakers.thresholds[0].max_connections.value == 7
    assert unpacked(here[RATINGS]).circuit_breakers.thresholds[0].max_connections.value != 7


def test_a_route_to_one_port_of_an_imported_service_does_not_split_namespaces() -> None:
    # The VirtualService's destination imports one port of a service every namespace imports whole:
    # the scope keeps the imported service itself, so the namespaces still share one build.
    docs = [
        *mesh_objects(),
        service("multi", "default", "10.96.0.60", [("http", 80), ("grpc", 81)], {"app": "multi"}),
        istio(
            "VirtualService",
            "multi",
            "default",
            {
                "hosts": ["multi"],
                "http": [{"route": [{"destination": {"host": "multi", "port": {"number": 80}}}]}],
            },
        ),
    ]
    model = build(docs)
    generator = CountingGenerator()
    here = outbound(generator, model, model.proxy(CLIENT))
    there = outbound(generator, model, model.proxy(OTHER))
    assert generator.built == 1
    assert here == there
    assert {
        "outbound|80||multi.default.svc.cluster.local",
        "outbound|81||multi.default.svc.cluster.local",
    } <= set(here)


@pytest.mark.parametrize("first", ["default", "other"])
def test_a_sidecar_that_imports_less_keeps_its_namespace_apart(first: str) -> None:
    # The DNS ServiceEntry is imported on both sides, so the keys differ by the imports alone.
    sidecar = istio("Sidecar", "local-only", "other", {"egress": [{"hosts": ["./*", "*/api.example.com"]}]})
    model = build([*mesh_objects(), sidecar])
    generator = CountingGenerator()
    order = [CLIENT, OTHER] if first == "default" else [OTHER, CLIENT]
    found = {node: outbound(generator, model, model.proxy(node)) for node in order}
    assert generator.built == 2
    assert set(found[OTHER]) == {RATINGS, EXTERNAL}
    assert RATINGS in found[CLIENT] and len(found[CLIENT]) > 1


# -- listeners ------------------------------------------------------------------------------------


def outbound_listeners(model: Model, node: str) -> dict[str, bytes]:
    proxy = model.proxy(node)
    ctx = GenerationContext(proxy, model.push, model.index, PushRequest(push=model.push))
    resources = lds.ListenerGenerator().generate(ctx, WatchedResource(TypeUrl.LISTENER.value), None) or []
    # The outbound side: the inbound listeners are built apart (and kept across snapshots).
    inbound = ("virtualInbound", "0.0.0.0_15006")
    return {r.name: r.payload for r in resources if not r.name.startswith(inbound)}


def counted_builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The proxies whose outbound listeners were built (not taken from another's build)."""
    built: list[str] = []
    real = lds.build_outbound_listeners

    def counting(proxy: Proxy, push: Any, index: Any) -> list[Any]:
        built.append(proxy.id)
        return real(proxy, push, index)

    monkeypatch.setattr(lds, "build_outbound_listeners", counting)
    return built


def listeners_alone(docs: list[dict[str, Any]], node: str) -> dict[str, bytes]:
    """What the proxy gets in a snapshot where no other proxy was generated."""
    return outbound_listeners(build(docs), node)


def without_headless() -> list[dict[str, Any]]:
    """The shared mesh but its headless service, whose listeners are each proxy's own (its address)."""
    return [d for d in mesh_objects() if d["metadata"]["name"] != "headless"]


def test_listeners_of_namespaces_importing_the_same_are_built_once(monkeypatch: pytest.MonkeyPatch) -> None:
    built = counted_builds(monkeypatch)
    model = build(without_headless())
    here = outbound_listeners(model, CLIENT)
    there = outbound_listeners(model, OTHER)
    assert len(built) == 1
    assert DB_LISTENER in there
    # Tracing names each workload, so the shared build is retraced per proxy: compare with builds alone.
    assert here == listeners_alone(without_headless(), CLIENT)
    assert there == listeners_alone(without_headless(), OTHER)


def tcp_proxy_cluster(payload: bytes) -> str:
    listener = listener_pb2.Listener()
    any_pb2.Any.FromString(payload).Unpack(listener)
    chains = [*listener.filter_chains, listener.default_filter_chain]
    out = tcp_proxy_pb2.TcpProxy()
    chains[0].filters[-1].typed_config.Unpack(out)
    return out.cluster


CACHE = "outbound|6000||cache.default.svc.cluster.local"
DB = "outbound|3306||db.default.svc.cluster.local"


def kept_apart(docs: list[dict[str, Any]], first: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Each namespace's proxy gets its own build, equal to its build alone, generated with ``first``
    first (a wrong share hands the first one's listeners on): the db listener's tcp_proxy cluster."""
    built = counted_builds(monkeypatch)
    model = build(docs)
    order = (first, OTHER if first == CLIENT else CLIENT)
    found = {node: outbound_listeners(model, node) for node in order}
    assert len(built) == 2
    assert found == {node: listeners_alone(docs, node) for node in order}
    return {node: tcp_proxy_cluster(found[node][DB_LISTENER]) for node in order}


@pytest.mark.parametrize("first", [CLIENT, OTHER])
def test_a_route_matching_the_source_namespace_keeps_namespaces_apart(
    first: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    route = istio(
        "VirtualService",
        "db-from-other",
        "default",
        {
            "hosts": ["db"],
            "tcp": [
                {"match": [{"sourceNamespace": "other"}], "route": [{"destination": {"host": "cache"}}]},
                {"route": [{"destination": {"host": "db"}}]},
            ],
        },
    )
    assert kept_apart([*without_headless(), route], first, monkeypatch) == {OTHER: CACHE, CLIENT: DB}


@pytest.mark.parametrize("first", [CLIENT, OTHER])
def test_a_virtual_service_exported_to_its_own_namespace_keeps_namespaces_apart(
    first: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both namespaces import the same services; only the VirtualService each sees differs.
    route = istio(
        "VirtualService",
        "db-to-cache",
        "other",
        {
            "hosts": ["db.default.svc.cluster.local"],
            "exportTo": ["."],
            "tcp": [{"route": [{"destination": {"host": "cache.default.svc.cluster.local"}}]}],
        },
    )
    assert kept_apart([*without_headless(), route], first, monkeypatch) == {OTHER: CACHE, CLIENT: DB}


def test_a_sidecar_scope_keeps_its_listeners(monkeypatch: pytest.MonkeyPatch) -> None:
    # The same imports as the namespace without a Sidecar, but a Sidecar's scope is never shared.
    sidecar = istio("Sidecar", "everything", "other", {"egress": [{"hosts": ["*/*"]}]})
    built = counted_builds(monkeypatch)
    docs = [*without_headless(), sidecar]
    model = build(docs)
    found = {node: outbound_listeners(model, node) for node in (CLIENT, OTHER)}
    assert len(built) == 2
    assert found == {node: listeners_alone(docs, node) for node in (CLIENT, OTHER)}


# -- routes -----------------------------------------------------------------------------------------


def routes(model: Model, node: str) -> dict[str, bytes]:
    proxy = model.proxy(node)
    ctx = GenerationContext(proxy, model.push, model.index, PushRequest(push=model.push), XdsCache())
    resources = RouteGenerator().generate(ctx, WatchedResource(TypeUrl.ROUTE.value), frozenset({"9080"}))
    return {r.name: r.payload for r in resources or []}


def counted_parts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The scopes' namespaces whose route cache parts were worked out (not taken from another's)."""
    counted: list[str] = []
    real = rds.route_cache_parts

    def counting(scope: Any, name: str, domain_suffix: str) -> Any:
        counted.append(scope.namespace)
        return real(scope, name, domain_suffix)

    monkeypatch.setattr(rds, "route_cache_parts", counting)
    return counted


def test_route_cache_parts_of_namespaces_importing_the_same_are_worked_out_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counted = counted_parts(monkeypatch)
    model = build(mesh_objects())
    here, there = routes(model, CLIENT), routes(model, OTHER)
    assert counted == ["default"]
    # Short names differ by namespace: the routes themselves are each namespace's own.
    assert here != there
    assert here == routes(build(mesh_objects()), CLIENT)
    assert there == routes(build(mesh_objects()), OTHER)


@pytest.mark.parametrize("first", [CLIENT, OTHER])
def test_a_virtual_service_exported_to_its_own_namespace_keeps_route_parts_apart(
    first: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only "other" sees the VirtualService: a shared answer would key one namespace's route by the
    # other's inputs, and a change to the VirtualService would not evict "other"'s route.
    split = istio(
        "VirtualService",
        "ratings-split",
        "other",
        {
            "hosts": ["ratings.other.svc.cluster.local"],
            "exportTo": ["."],
            "http": [
                {"route": [{"destination": {"host": "ratings.other.svc.cluster.local"}, "weight": 100}]}
            ],
        },
    )
    docs = [*mesh_objects(), split]
    counted = counted_parts(monkeypatch)
    model = build(docs)
    order = (first, OTHER if first == CLIENT else CLIENT)
    found = {node: routes(model, node) for node in order}
    assert sorted(counted) == ["default", "other"]
    assert found == {node: routes(build(docs), node) for node in order}
    key = ConfigKey(Kind.VIRTUAL_SERVICE, "ratings-split", "other")
    parts = {node: rds._cache_parts(model.push, model.proxy(node).sidecar_scope, "9080") for node in order}
    assert parts[OTHER] is not None and key in parts[OTHER].dependencies
    assert parts[CLIENT] is not None and key not in parts[CLIENT].dependencies


def test_a_sidecar_scope_importing_the_same_keeps_its_route_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    # The same imports as the namespace without a Sidecar, but an egress proxy of its own, which the
    # routes' fallback reads: a shared answer would leave it out of the Sidecar scope's cache key.
    sidecar = istio(
        "Sidecar",
        "everything",
        "other",
        {
            "egress": [{"hosts": ["*/*"]}],
            "outboundTrafficPolicy": {
                "mode": "ALLOW_ANY",
                "egressProxy": {"host": "egress.default.svc.cluster.local", "port": {"number": 80}},
            },
        },
    )
    counted = counted_parts(monkeypatch)
    docs = [*mesh_objects(), sidecar]
    model = build(docs)
    parts = {
        node: rds._cache_parts(model.push, model.proxy(node).sidecar_scope, "9080")
        for node in (CLIENT, OTHER)
    }
    assert sorted(counted) == ["default", "other"]
    assert parts[CLIENT] is not None and parts[OTHER] is not None
    assert parts[CLIENT].fingerprint != parts[OTHER].fingerprint
    assert {node: routes(model, node) for node in (CLIENT, OTHER)} == {
        node: routes(build(docs), node) for node in (CLIENT, OTHER)
    }
