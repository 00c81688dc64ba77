"""What a served ADS stream holds while it waits: none of the requests it read, nor its last push.

A stream's loop and reader wait for minutes between pushes and requests, and their frames live as
long as the stream. A request left in one of them stays for that long: a delta proxy's first request
after a reconnect names every resource it holds (at 2,000 proxies of a thousand clusters each, such
requests kept the server's memory 700 MB above what the same proxies took after a fresh start), and a
state-of-the-world EDS ACK names every cluster again.
"""

from __future__ import annotations

import gc
import types
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from envoy.service.discovery.v3 import discovery_pb2
from support.xds_server import NODE, Server, three_services

from meshpilot.model.push_request import PushRequest
from meshpilot.xds import sotw_stream, stream

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
REVIEWS = "outbound|9080||reviews.default.svc.cluster.local"
#: The frames that live as long as a stream, and wait in it for minutes.
WAITING = ("run", "_loop", "_read")
HELD_TYPES = (
    bytes,
    memoryview,
    discovery_pb2.DiscoveryRequest,
    discovery_pb2.DeltaDiscoveryRequest,
    sotw_stream._Incoming,
    PushRequest,
)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    async with three_services(tmp_path) as served:
        yield served


def _holds(value: Any) -> bool:
    if isinstance(value, tuple):
        return any(_holds(v) for v in value)
    return isinstance(value, HELD_TYPES)


def held_by_waiting_frames() -> list[str]:
    """``function: local`` for each local of a live stream's waiting frames (``WAITING``) that holds a
    request or a push. Coroutines are found among all objects, not by following tasks: grpc awaits a
    handler through a wrapper that does not name what it awaits. Only open streams' frames count,
    after a collection, so another test's leftovers cannot decide; and each waiting frame must be
    seen, so that finding none is not a pass."""
    gc.collect()
    held: list[str] = []
    seen: set[str] = set()
    for found in gc.get_objects():
        if not isinstance(found, types.CoroutineType) or found.cr_frame is None or found.cr_running:
            continue
        frame = found.cr_frame
        owner = frame.f_locals.get("self")
        if frame.f_code.co_name not in WAITING or not isinstance(owner, stream.Stream) or owner.closed:
            continue
        seen.add(frame.f_code.co_name)
        held += [f"{frame.f_code.co_name}: {n}" for n, v in frame.f_locals.items() if _holds(v)]
    assert seen == set(WAITING), f"only {sorted(seen)} of the stream's waiting frames were found"
    return held


async def test_a_delta_stream_waits_holding_none_of_its_requests(server: Server) -> None:
    client = server.delta_client()
    try:
        # A reconnect: the first request names what the proxy holds.
        client.send(CDS, node_id=NODE, initial={REVIEWS: "0" * 16})
        client.ack(await client.recv())
        # Queued for the loop, not recorded by the reader: a subscription.
        client.send(EDS, [REVIEWS])
        client.ack(await client.recv())
        assert await client.no_response(0.3)
        assert held_by_waiting_frames() == []
        # A push (nothing changed, so nothing is sent): not held after it either.
        server.app.server.push_all()
        assert await client.no_response(0.5)
        assert held_by_waiting_frames() == []
        # Still served: what was let go was not needed.
        client.send(EDS, ["outbound|9080||ratings.default.svc.cluster.local"])
        assert [r.name for r in (await client.recv()).resources] == [
            "outbound|9080||ratings.default.svc.cluster.local"
        ]
    finally:
        await client.close()


async def test_a_state_of_the_world_stream_waits_holding_none_of_its_requests(server: Server) -> None:
    client = server.client()
    try:
        client.send(CDS, node_id=NODE)
        client.ack(await client.recv())
        client.send(EDS, [REVIEWS])
        client.ack(await client.recv(), [REVIEWS])
        assert await client.no_response(0.3)
        assert held_by_waiting_frames() == []
    finally:
        await client.close()
