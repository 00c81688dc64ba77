"""Outbound clusters shared by the scopes of a snapshot that import the same services and rules.

A full push builds a scope's outbound clusters once; scopes of other namespaces with the same
imports (the same service and DestinationRule objects, in the same order) reuse that list. These
tests check both sides: what is the same is built once, and what differs by namespace (a rule
exported to its own namespace, a Sidecar's imports) is never handed to another namespace.
"""

from __future__ import annotations

from typing import Any

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from support.kube import istio
from support.mesh_objects import CLIENT, mesh_objects
from support.model import Model, build

from meshpilot.model.proxy import Proxy
from meshpilot.model.push_request import PushRequest
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.generators.base import GenerationContext
from meshpilot.xds.generators.cds import ClusterGenerator
from meshpilot.xds.types import TypeUrl

OTHER = "sidecar~10.1.0.31~ratings-v1.other~other.svc.cluster.local"
RATINGS = "outbound|9080||ratings.other.svc.cluster.local"
EXTERNAL = "outbound|443||api.example.com"


class CountingGenerator(ClusterGenerator):
    """Counts the outbound lists built (one per distinct scope, capabilities and DNS view)."""

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
    from google.protobuf import any_pb2

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
