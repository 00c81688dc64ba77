"""A proxy's previous Sidecar scope serves the push that recomputed it and is released after that push's
decision (``xds.stream``): a host that just left the scope still gets the proxy its push, and the old
scope with every service it imported is not kept until the proxy's next full push."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from support.kube import workload, write
from support.xds_server import NODE, Server, three_services

from meshpilot.model.proxy import Proxy
from meshpilot.model.push_request import PushRequest
from meshpilot.xds import stream
from meshpilot.xds.dependencies import proxy_needs_push

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
RATINGS_HOST = "ratings.default.svc.cluster.local"
RATINGS = f"outbound|9080||{RATINGS_HOST}"


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    async with three_services(tmp_path) as served:
        yield served


async def test_a_host_leaving_the_scope_is_pushed_and_the_old_scope_released(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    decisions: list[tuple[bool, bool, bool]] = []

    def recording(proxy: Proxy, request: PushRequest, root_namespace: str) -> bool:
        previous, current = proxy.previous_scope, proxy.sidecar_scope
        needed = proxy_needs_push(proxy, request, root_namespace)
        decisions.append(
            (
                previous is not None and previous.service(RATINGS_HOST) is not None,
                current is not None and current.service(RATINGS_HOST) is not None,
                needed,
            )
        )
        return needed

    monkeypatch.setattr(stream, "proxy_needs_push", recording)
    client = server.client()
    client.send(CDS, node_id=NODE)
    first = await client.recv()
    assert RATINGS in [cluster_pb2.Cluster.FromString(r.value).name for r in first.resources]
    client.ack(first)
    assert await client.no_response(0.3)

    # ratings goes away: only the scope before this push imports it, so only the previous scope
    # makes the change concern the proxy.
    write(
        server.config_dir / "apps.yaml",
        [
            *workload("productpage", "default", "10.96.0.10", 9080, {"productpage-v1": "127.0.0.11"}),
            *workload("reviews", "default", "10.96.0.20", 9080, {"reviews-v1": "127.0.0.21"}),
        ],
    )
    pushed = await client.recv(10)
    assert pushed.type_url == CDS
    assert RATINGS not in [cluster_pb2.Cluster.FromString(r.value).name for r in pushed.resources]
    client.ack(pushed)
    assert decisions[-1] == (True, False, True), "decided with ratings in the previous scope only"

    proxy = next(iter(server.app.server.connections.values())).proxy
    assert proxy.previous_scope is None, "released once the push was decided"
    assert proxy.sidecar_scope is not None and proxy.sidecar_scope.service(RATINGS_HOST) is None
    await client.close()
