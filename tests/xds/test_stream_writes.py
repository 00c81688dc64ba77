"""When a stream writes a generated response: after the other streams pushed in the same turn generated."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from envoy.service.discovery.v3 import discovery_pb2
from support.kube import write
from support.xds_server import NODE, apps, three_services

from meshpilot.xds.stream import Stream

EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
REVIEWS = "outbound|9080||reviews.default.svc.cluster.local"


def test_streams_pushed_in_one_turn_all_generate_before_any_writes() -> None:
    events: list[tuple[str, str]] = []
    observed: list[float] = []

    class Context:
        def __init__(self, name: str) -> None:
            self.name = name

        async def write(self, payload: bytes) -> None:
            events.append(("write", self.name))

    host = SimpleNamespace(metrics=SimpleNamespace(send_time=SimpleNamespace(observe=observed.append)))

    async def push(name: str) -> None:
        events.append(("generate", name))
        stream = cast(Any, SimpleNamespace(context=Context(name), host=host))
        await Stream._write(stream, b"response")

    async def both() -> None:
        await asyncio.gather(push("a"), push("b"), push("c"))

    asyncio.run(both())
    # One at a time, each write would follow its own generation: a, a, b, b, c, c.
    assert events == [("generate", n) for n in "abc"] + [("write", n) for n in "abc"]
    assert len(observed) == 3 and all(seconds >= 0 for seconds in observed)


async def test_both_protocols_write_their_pushes_through_the_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the test above shows of ``_write`` holds for a push only if each protocol's responses go
    # through it: a state-of-the-world and a delta sidecar, a real server, one endpoint change.
    written: list[tuple[str, bytes]] = []
    write_through = Stream._write

    async def recorded(self: Stream, payload: bytes) -> None:
        written.append((self.protocol, payload))
        await write_through(self, payload)

    monkeypatch.setattr(Stream, "_write", recorded)
    async with three_services(tmp_path) as server:
        sotw = server.client()
        sotw.send(EDS, [REVIEWS], node_id=NODE)
        sotw.ack(await sotw.recv(), [REVIEWS])
        delta = server.delta_client()
        delta.send(EDS, [REVIEWS], node_id="sidecar~127.0.0.12~client-0.default~default.svc.cluster.local")
        delta.ack(await delta.recv())
        assert [protocol for protocol, _ in written] == ["sotw", "delta"], "answers go through it too"
        written.clear()
        write(server.config_dir / "apps.yaml", apps({"reviews-v1": "127.0.0.21", "reviews-v2": "127.0.0.22"}))
        pushed_sotw, pushed_delta = await sotw.recv(10), await delta.recv(10)
        assert sorted(protocol for protocol, _ in written) == ["delta", "sotw"]
        by_protocol = dict(written)
        assert discovery_pb2.DiscoveryResponse.FromString(by_protocol["sotw"]) == pushed_sotw
        assert discovery_pb2.DeltaDiscoveryResponse.FromString(by_protocol["delta"]) == pushed_delta
        await sotw.close()
        await delta.close()
