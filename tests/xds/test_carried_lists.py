"""Lists the proxies of a scope share, carried from one snapshot to the next while they stay the same
(``PushContext.carried``, ``generators.base.same_list`` and ``joined``).

A VirtualService push makes every proxy's clusters and listeners again, and each workload's list
joins the shared outbound part (a thousand entries in the benchmark) with its own inbound part. The
lists are now kept from the previous snapshot when their content is unchanged, so that push joins
none of them again. The generator cases check what a proxy gets against what a new environment builds
from the same objects: a list kept when it should have changed would push stale config.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import weakref
from pathlib import Path
from typing import Any

from support.ads_client import AdsClient
from support.kube import istio, service, write
from support.mesh_objects import CLIENT, mesh_objects
from support.model import Model, build
from support.xds_server import NODE, three_services

from meshpilot.model.push_context import PushContext
from meshpilot.model.push_request import PushRequest
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.generators.base import (
    GenerationContext,
    Generator,
    Resource,
    ResourceList,
    joined,
    same_list,
)
from meshpilot.xds.generators.cds import ClusterGenerator
from meshpilot.xds.generators.lds import ListenerGenerator
from meshpilot.xds.types import TypeUrl


def resources(*payloads: bytes) -> ResourceList:
    return ResourceList(Resource(p.decode(), p) for p in payloads)


_VERSIONS = itertools.count(2)


def _next(model: Model) -> PushContext:
    model.push = model.env.build_push_context(f"test/{next(_VERSIONS)}")
    return model.push


def test_an_entry_reaches_the_next_snapshot_only_while_each_asks_for_it() -> None:
    model = build(mesh_objects())
    made: list[str] = []

    def make(tag: str) -> str:
        made.append(tag)
        return tag

    assert model.push.carried("k", lambda: make("first")) == "first"
    assert _next(model).carried("k", lambda: make("second")) == "first"
    _next(model)  # asks nothing: the entry is not handed on
    assert _next(model).carried("k", lambda: make("third")) == "third"
    assert made == ["first", "third"]


def test_an_entry_asked_for_by_every_snapshot_is_carried_along_the_chain() -> None:
    model = build(mesh_objects())
    first = model.push.carried("k", object)
    for _ in range(4):
        assert _next(model).carried("k", object) is first


def test_without_shared_outputs_nothing_is_carried() -> None:
    model = build(mesh_objects())
    model.env.share_outputs = False
    model.push = model.env.build_push_context("unshared")
    model.push.carried("k", lambda: "first")
    assert model.push.carried("k", lambda: "again") == "again"
    assert _next(model).carried("k", lambda: "later") == "later"


class _Held:
    """Something an entry holds, to watch it freed (weakly referenced)."""


def test_released_entries_are_let_go_and_taken_ones_stay() -> None:
    model = build(mesh_objects())
    taken = model.push.carried("taken", _Held)
    left_ref = weakref.ref(model.push.carried("left", _Held))
    push = _next(model)
    assert push.carried("taken", _Held) is taken
    gc.collect()
    assert left_ref() is not None, "held for the next snapshot until released"
    push.release_carried()
    gc.collect()
    assert left_ref() is None
    assert _next(model).carried("taken", _Held) is taken, "taken over before the release"


def test_a_preview_snapshot_takes_nothing_over() -> None:
    model = build(mesh_objects())
    model.push.carried("k", lambda: "first")
    preview = model.env.build_push_context("preview", keep_lasting=False)
    assert preview.carried("k", lambda: "own") == "own"
    # Nor does it take the place of the live snapshot as the one the next takes over from.
    assert _next(model).carried("k", lambda: "later") == "first"


def test_a_list_made_again_with_the_same_resources_is_the_previous_one() -> None:
    model = build(mesh_objects())
    first = same_list(model.push, resources(b"a", b"b"))
    push = _next(model)
    assert same_list(push, resources(b"a", b"b")) is first
    changed = resources(b"a", b"c")
    assert same_list(push, changed) is changed
    renamed = ResourceList([Resource("other", b"a"), Resource("b", b"b")])
    assert same_list(push, renamed) is renamed, "a payload under another name is another list"


def test_lists_whose_digests_collide_are_told_apart() -> None:
    model = build(mesh_objects())
    first = same_list(model.push, ResourceList([Resource("a", b"x")], digest=1))
    other = ResourceList([Resource("a", b"y")], digest=1)
    assert same_list(_next(model), other) is other
    assert same_list(model.push, ResourceList([Resource("a", b"x")], digest=1)) is first


def test_a_joined_list_is_carried_while_both_parts_are_the_same_objects() -> None:
    model = build(mesh_objects())
    out, inbound = resources(b"o1", b"o2"), resources(b"i1")
    first = joined(model.push, out, inbound)
    push = _next(model)
    assert joined(push, out, inbound) is first
    other = resources(b"o1", b"o3")
    assert list(joined(push, other, inbound)) == [*other, *inbound]


# -- the generators ---------------------------------------------------------------------------


def generated(model: Model, generator: Generator, type_url: TypeUrl) -> list[Resource]:
    proxy = model.proxy(CLIENT)
    ctx = GenerationContext(proxy, model.push, model.index, PushRequest(push=model.push))
    return generator.generate(ctx, WatchedResource(type_url.value, wildcard=True), None) or []


def payloads(found: list[Resource]) -> dict[str, bytes]:
    return {r.name: r.payload for r in found}


def without_headless() -> list[dict[str, Any]]:
    # A headless service's listeners name each proxy's own address: that list is the proxy's own.
    return [d for d in mesh_objects() if d["metadata"]["name"] != "headless"]


ROUTE = istio(
    "VirtualService",
    "reviews",
    "default",
    {"hosts": ["reviews"], "http": [{"route": [{"destination": {"host": "reviews", "subset": "v1"}}]}]},
)
POOL = istio(
    "DestinationRule",
    "ratings",
    "other",
    {
        "host": "ratings.other.svc.cluster.local",
        "trafficPolicy": {"connectionPool": {"tcp": {"maxConnections": 7}}},
    },
)
NEW_PORT = service("search", "default", "10.96.0.60", [("http", 8000)], {"app": "search"})


def test_clusters_are_the_same_list_after_a_virtual_service_and_new_after_a_destination_rule() -> None:
    docs = without_headless()
    model = build(docs)
    before = generated(model, ClusterGenerator(), TypeUrl.CLUSTER)
    model.upsert(ROUTE)
    _next(model)
    kept = generated(model, ClusterGenerator(), TypeUrl.CLUSTER)
    assert kept is before, "nothing a cluster reads changed: the list is carried"
    assert payloads(kept) == payloads(generated(build([*docs, ROUTE]), ClusterGenerator(), TypeUrl.CLUSTER))
    model.upsert(POOL)
    _next(model)
    changed = generated(model, ClusterGenerator(), TypeUrl.CLUSTER)
    fresh = generated(build([*docs, ROUTE, POOL]), ClusterGenerator(), TypeUrl.CLUSTER)
    assert payloads(changed) == payloads(fresh)
    assert payloads(changed) != payloads(kept)


def test_listeners_are_the_same_list_after_a_virtual_service_and_new_after_a_service() -> None:
    docs = without_headless()
    model = build(docs)
    before = generated(model, ListenerGenerator(), TypeUrl.LISTENER)
    model.upsert(ROUTE)
    _next(model)
    kept = generated(model, ListenerGenerator(), TypeUrl.LISTENER)
    assert kept is before
    assert payloads(kept) == payloads(generated(build([*docs, ROUTE]), ListenerGenerator(), TypeUrl.LISTENER))
    model.upsert(NEW_PORT)
    _next(model)
    changed = generated(model, ListenerGenerator(), TypeUrl.LISTENER)
    fresh = generated(build([*docs, ROUTE, NEW_PORT]), ListenerGenerator(), TypeUrl.LISTENER)
    assert payloads(changed) == payloads(fresh)
    assert "0.0.0.0_8000" in payloads(changed) and "0.0.0.0_8000" not in payloads(kept)


# -- the server ---------------------------------------------------------------------------------


async def test_once_a_push_reached_every_connection_the_previous_snapshot_is_let_go(tmp_path: Path) -> None:
    async with three_services(tmp_path) as server:
        client = AdsClient(server.target)
        client.send(TypeUrl.CLUSTER.value, node_id=NODE)
        client.ack(await client.recv())
        before = server.app.server.push_context
        assert before is not None
        stale_ref = weakref.ref(before.carried(("test", "stale"), _Held))
        del before
        write(server.config_dir / "vs.yaml", [ROUTE])
        # The clusters are the same and are not sent (not even built): the push is over when that
        # is counted.
        for _ in range(200):
            if server.metric("meshpilot_xds_unchanged_skipped_total", type="cds") >= 1:
                break
            await asyncio.sleep(0.025)
        assert server.metric("meshpilot_xds_unchanged_skipped_total", type="cds") >= 1
        for _ in range(100):
            gc.collect()
            if stale_ref() is None:
                break
            await asyncio.sleep(0.02)
        assert stale_ref() is None, "the snapshot before the push's is held no longer"
        await client.close()
