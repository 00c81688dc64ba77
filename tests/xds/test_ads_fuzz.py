"""ADS, both protocols, under hostile and random requests: each stream ends with a clear status or
keeps going; the server never fails inside, and an ordinary proxy keeps being served throughout.
What the flood costs is bounded too: log bytes per message, no tracebacks, and metric series (the
requests carry made-up type URLs, versions, 64 KB NACK details, 1 MB node IDs, deeply nested
POD_PORTS)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from envoy.service.discovery.v3 import discovery_pb2
from support.ads_client import DeltaClient, lost_status
from support.kube import workload, write
from support.log_volume import log_volume, series
from support.xds_server import NODE, Server, three_services

from bench.ads_flood import Mix, random_delta, random_sotw

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
#: The requests of the flood (bench/ads_flood.py), with the oversized parts ten times as often as in
#: the flood: here each is sent and answered one at a time, and must be refused clearly.
MIX = Mix(heavy=0.1)

#: Log bytes the server may write per bad message, on average over the flood (one clipped line
#: and a share of the per-stream connect and disconnect lines).
LOG_BYTES_PER_MESSAGE = 600
#: How a stream may end: a refusal the server chose, not a failure (UNAUTHENTICATED: a debug type
#: asked for on the plaintext port, as istiod refuses it).
CLEAR = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAUTHENTICATED,
}


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    async with three_services(tmp_path) as served:
        yield served


async def _fuzz_stream(server: Server, seed: int, protocol: str, sent: list[int]) -> grpc.StatusCode | None:
    rng = random.Random(seed)
    client = server.delta_client() if protocol == "delta" else server.client()
    nonces: list[str] = []
    try:
        for i in range(rng.randrange(1, 15)):
            sent[0] += 1
            if isinstance(client, DeltaClient):
                client.send_raw(random_delta(rng, nonces, first=i == 0, mix=MIX))
            else:
                client.send_message(
                    discovery_pb2.DiscoveryRequest.FromString(random_sotw(rng, nonces, first=i == 0, mix=MIX))
                )
            try:
                while True:
                    response = await client.recv(0.05)
                    nonces.append(response.nonce)
            except TimeoutError:
                pass
        return None
    except grpc.aio.AioRpcError as err:
        if lost_status(err):
            return None
        return err.code()
    except EOFError:
        return grpc.StatusCode.OK
    finally:
        await client.close()


@pytest.mark.parametrize("protocol", ["delta", "sotw"])
async def test_random_streams_end_clearly_and_others_are_served(server: Server, protocol: str) -> None:
    bystander = server.delta_client()
    bystander.send(CDS, node_id=NODE)
    bystander.ack(await bystander.recv())
    bystander.send(EDS, ["outbound|9080||reviews.default.svc.cluster.local"])
    bystander.ack(await bystander.recv())

    before = series(server.app.metrics.exposition())
    sent = [0]
    with log_volume() as logs:
        ends = [await _fuzz_stream(server, seed, protocol, sent) for seed in range(60)]
    unclear = [(seed, code) for seed, code in enumerate(ends) if code is not None and code not in CLEAR]
    assert not unclear, f"streams ended with statuses that are not a refusal: {unclear}"
    assert any(code in CLEAR for code in ends), "some of the random requests must have been refused"
    assert server.metric("pilot_total_xds_internal_errors_total") == 0

    assert not logs.tracebacks, f"tracebacks logged: {logs.tracebacks[:3]}"
    assert logs.longest <= 2_000, f"a log line of {logs.longest} bytes"
    per_message = logs.bytes / sent[0]
    assert per_message <= LOG_BYTES_PER_MESSAGE, f"{per_message:.0f} log bytes per message ({sent[0]} sent)"
    # Every label from the flood maps onto a known set: a few new series (refusal reasons, per-type
    # push metrics, a version label or two), not one per made-up type URL or version.
    grown = series(server.app.metrics.exposition()) - before
    assert grown <= 120, f"{grown} new metric series after the flood"
    print(
        f"{protocol}: {sent[0]} messages, {logs.bytes} log bytes ({per_message:.0f}/message, "
        f"longest line {logs.longest}), {grown} new series"
    )

    write(
        server.config_dir / "apps.yaml",
        [
            *workload("productpage", "default", "10.96.0.10", 9080, {"productpage-v1": "127.0.0.11"}),
            *workload(
                "reviews", "default", "10.96.0.20", 9080, {"reviews-v1": "127.0.0.21", "r2": "127.0.0.22"}
            ),
            *workload("ratings", "default", "10.96.0.30", 9080, {"ratings-v1": "127.0.0.31"}),
        ],
    )
    pushed = await bystander.recv(10)
    assert pushed.type_url == EDS, "the ordinary proxy still gets its pushes"
    await bystander.close()
