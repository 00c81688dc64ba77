"""What one proxy sends cannot blow up a status, a log or /metrics: a 1 MB node ID and nested POD_PORTS
are refused with INVALID_ARGUMENT, NACK floods are clipped and rate-limited, and made-up versions
share a bounded set of pilot_xds series."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from support.ads_client import AdsClient, refusal
from support.kube import workload, write
from support.log_volume import log_volume, series
from support.xds_server import NODE, Server, running, settings_for

from meshpilot.metric_labels import MAX_VERSIONS

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    config = tmp_path / "config"
    write(config / "apps.yaml", workload("reviews", "default", "10.96.0.20", 9080, {"r1": "127.0.0.21"}))
    # Streams open faster than istiod's default new-stream rate here: the test opens hundreds.
    async with running(settings_for(config, max_requests_per_second=100_000.0)) as app:
        yield Server(app, config)


async def test_a_megabyte_node_id_is_invalid_argument_with_a_short_status(server: Server) -> None:
    err = await refusal(server.target, lambda c: c.send(CDS, node_id="sidecar~" + "1" * 1_000_000))
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "at most 1024" in err.details() and len(err.details()) < 200


async def test_nested_pod_ports_are_invalid_argument(server: Server) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    for text in (deep, "[" * 500 + "]" * 500):

        def send(client: AdsClient, text: str = text) -> None:
            meta = {"NAMESPACE": "default", "INTERCEPTION_MODE": "NONE", "POD_PORTS": text}
            client.send(CDS, node_id=NODE, node_metadata=meta)

        err = await refusal(server.target, send)
        assert err.code() is grpc.StatusCode.INVALID_ARGUMENT, err
        assert "POD_PORTS" in err.details()


async def test_a_nack_flood_is_clipped_and_rate_limited(server: Server) -> None:
    client = server.client()
    client.send(CDS, node_id=NODE)
    response = await client.recv()
    with log_volume() as logs:
        for i in range(300):
            detail = f"rejected {i}\nforged line\n" + "x" * 100_000
            client.send(CDS, nonce=response.nonce, error=detail)
        client.send(CDS, nonce=response.nonce)  # an ACK after them: all were read once it is answered
        await client.no_response(0.5)
    await client.close()
    assert server.metric("pilot_total_xds_rejects_total", type="cds") == 300
    assert logs.lines <= 6, f"{logs.lines} lines for 300 NACKs of one proxy"
    assert logs.longest <= 1_400
    assert not logs.tracebacks


async def test_made_up_versions_share_a_bounded_set_of_series(server: Server) -> None:
    before = series(server.app.metrics.exposition())
    clients = []
    for i in range(300):
        version = f"1.{i}.0" if i % 2 else f"build-{i}\n"
        client = AdsClient(server.target)
        meta = {"NAMESPACE": "default", "INTERCEPTION_MODE": "NONE", "ISTIO_VERSION": version}
        client.send(CDS, node_id=NODE, node_metadata=meta)
        clients.append(client)
    await asyncio.gather(*(c.recv(20) for c in clients))
    exposition = server.app.metrics.exposition().decode()
    versions = [line for line in exposition.splitlines() if line.startswith("pilot_xds{")]
    # MAX_VERSIONS patterns, "other" for the rest of them, "unknown" for what is no version.
    assert len(versions) == MAX_VERSIONS + 2, versions
    assert 'pilot_xds{version="other"} 118.0' in versions
    assert 'pilot_xds{version="unknown"} 150.0' in versions
    grown = series(exposition.encode()) - before
    assert grown < 60, f"{grown} new series for 300 proxies"
    for client in clients:
        await client.close()
    for _ in range(100):
        if not server.app.server.connections:
            break
        await asyncio.sleep(0.05)
    # A version nobody runs any more leaves /metrics.
    assert "pilot_xds{" not in server.app.metrics.exposition().decode()
