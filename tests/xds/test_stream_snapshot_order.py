"""Which snapshot a stream answers a request from, when the request overtakes a push.

A stream handles requests before the pushes handed to it and not yet handled (``StreamEvents``).
If it answered a request from the server's newest snapshot, a push queued before that snapshot was
built would then send an older one: the proxy's version would go back, and its config with it,
until the next push (seen in the push-worker pool's fleet test, where proxies that moved to another
worker subscribe while pushes stream in). A request is answered from the snapshot the stream last
served, as istiod answers one from the proxy's last push context.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from envoy.config.route.v3 import route_pb2
from support.kube import istio, write
from support.xds_server import NODE, Server, three_services

from meshpilot.model.push_request import PushRequest
from meshpilot.xds.stream import Stream

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
LDS = "type.googleapis.com/envoy.config.listener.v3.Listener"
RDS = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
REVIEWS = "outbound|9080||reviews.default.svc.cluster.local"
#: The names the client watches, by type (none: a wildcard).
WATCHED = {EDS: [REVIEWS], RDS: ["9080"]}


def reviews_timeout(server: Server, seconds: int) -> None:
    route = {"timeout": f"{seconds}s", "route": [{"destination": {"host": "reviews"}}]}
    spec = {"hosts": ["reviews"], "http": [route]}
    write(server.config_dir / "vs.yaml", [istio("VirtualService", "reviews", "default", spec)])


def timeout_of(resource: bytes) -> int:
    """The reviews route's timeout in a RouteConfiguration (0: none)."""
    rc = route_pb2.RouteConfiguration.FromString(resource)
    reviews = next(v for v in rc.virtual_hosts if v.name.startswith("reviews."))
    return reviews.routes[0].route.timeout.seconds


async def until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("protocol", ["sotw", "delta"])
async def test_a_request_that_overtakes_a_queued_push_gets_no_newer_snapshot_than_the_push(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, protocol: str
) -> None:
    # The stream's writes wait while the gate is closed: its loop is held in one, as a busy loop
    # would hold it, while a push and then a request queue up behind.
    gate = asyncio.Event()
    gate.set()
    held: list[Stream] = []
    write_through = Stream._write

    async def gated(self: Stream, payload: bytes) -> None:
        if not gate.is_set():
            held.append(self)
            await gate.wait()
        await write_through(self, payload)

    monkeypatch.setattr(Stream, "_write", gated)

    async with three_services(tmp_path) as server:
        core = server.app.server
        # Every snapshot the server pushes, in order: the order of the versions a proxy may see.
        assert core.push_context is not None
        order = [core.push_context.version]
        core.add_push_listener(lambda request: order.append(_version(request)))

        delta = server.delta_client() if protocol == "delta" else None
        sotw = server.client() if delta is None else None
        client = delta or sotw
        assert client is not None
        versions: list[str] = []
        timeouts: list[int] = []

        def ack(response: Any) -> None:
            if delta is not None:
                delta.ack(response)
            else:
                # A state-of-the-world ACK names what it still wants, as Envoy's does: none would
                # unsubscribe EDS and RDS.
                assert sotw is not None
                sotw.ack(response, WATCHED.get(response.type_url))

        async def take(type_url: str) -> None:
            response = await client.recv(10)
            assert response.type_url == type_url
            ack(response)

        client.send(CDS, node_id=NODE)
        await take(CDS)
        client.send(EDS, WATCHED[EDS])
        await take(EDS)

        gate.clear()
        client.send(LDS)
        await until(lambda: bool(held), "the LDS answer waits at the gate")
        stream = held[0]

        reviews_timeout(server, 3)
        await until(lambda: len(stream.events) == 1, "the first change's push is handed to the stream")
        pushed_first = core.push_context
        reviews_timeout(server, 4)
        await until(lambda: core.push_context is not pushed_first, "the second change is built")
        client.send(RDS, WATCHED[RDS])
        await until(lambda: len(stream.events) == 2, "the RDS request is queued behind the push")
        gate.set()

        # Every response until the routes carry the second change, and any after it until the stream
        # is quiet (a push older than the answer would come after it): the versions in push order.
        while True:
            try:
                response: Any = await client.recv(10 if not timeouts or timeouts[-1] != 4 else 1)
            except TimeoutError:
                assert timeouts and timeouts[-1] == 4, f"the second change never came: {timeouts}"
                break
            ack(response)
            if response.type_url != RDS:
                continue
            if protocol == "delta":
                versions.append(response.system_version_info)
                timeouts += [timeout_of(r.resource.value) for r in response.resources]
            else:
                versions.append(response.version_info)
                timeouts += [timeout_of(r.value) for r in response.resources]

        places = [order.index(v) for v in versions]
        assert places == sorted(places), f"RDS versions went back: {versions} (pushed in order {order})"
        assert timeouts == sorted(timeouts), f"route timeouts went back: {timeouts}"
        await client.close()


def _version(request: PushRequest) -> str:
    assert request.push is not None
    return request.push.version
