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
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.rpc import status_pb2
from support.ads_client import DeltaClient, lost_status, node
from support.kube import workload, write
from support.log_volume import log_volume, series
from support.xds_server import NODE, Server, three_services

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
LDS = "type.googleapis.com/envoy.config.listener.v3.Listener"
RDS = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
TYPES = [CDS, EDS, LDS, RDS, "type.googleapis.com/no.such.Type", "", "istio.io/debug/syncz"]
NAMES = [
    "*",
    "outbound|9080||reviews.default.svc.cluster.local",
    "outbound|9080||ratings.default.svc.cluster.local",
    "9080",
    "",
    "x" * 70_000,
    "\u00e9\u4e2d",
]
#: A NACK detail as a hostile client writes it: long, and with line breaks that would forge log lines.
DETAIL = "bad cluster\n2026-01-01T00:00:00Z\terror\tforged line " + "x" * 65_536
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


def _type_url(rng: random.Random) -> str:
    if rng.random() < 0.2:  # a new one every time: each would be a metric series if labelled as sent
        return f"type.googleapis.com/fuzz.T{rng.getrandbits(64):x}"
    return rng.choice(TYPES)


def _node(rng: random.Random) -> base_pb2.Node:
    roll = rng.random()
    if roll < 0.05:
        return node("")
    if roll < 0.1:
        return node("sidecar~" + "1" * 1_000_000)  # echoed whole, the status would not fit a header
    metadata = {
        "NAMESPACE": "default",
        "INTERCEPTION_MODE": "NONE",
        "ISTIO_VERSION": rng.choice(["1.28.0", f"1.{rng.randrange(10**6)}.0", f"v{rng.getrandbits(64):x}"]),
    }
    if rng.random() < 0.1:
        metadata["POD_PORTS"] = "[" * 100_000 + "]" * 100_000
    return node(NODE, metadata)


def _random_sotw(rng: random.Random, nonces: list[str], first: bool) -> discovery_pb2.DiscoveryRequest:
    request = discovery_pb2.DiscoveryRequest(
        type_url=_type_url(rng),
        resource_names=rng.sample(NAMES, rng.randrange(0, 3)),
        response_nonce=rng.choice([*nonces, "", "stale-nonce"]) if nonces else rng.choice(["", "x"]),
    )
    if first or rng.random() < 0.1:
        request.node.CopyFrom(_node(rng))
    if rng.random() < 0.1:
        request.error_detail.CopyFrom(status_pb2.Status(code=13, message=DETAIL))
    if rng.random() < 0.02:
        request.resource_names.extend(f"n{i}" for i in range(70_000))
    return request


def _random_delta(rng: random.Random, nonces: list[str], first: bool) -> bytes:
    if rng.random() < 0.05:
        return rng.randbytes(rng.randrange(1, 64))  # not a DeltaDiscoveryRequest at all
    request = discovery_pb2.DeltaDiscoveryRequest(
        type_url=_type_url(rng),
        resource_names_subscribe=rng.sample(NAMES, rng.randrange(0, 3)),
        resource_names_unsubscribe=rng.sample(NAMES, rng.randrange(0, 2)),
        response_nonce=rng.choice([*nonces, "", "stale-nonce"]) if nonces else rng.choice(["", "x"]),
    )
    if first or rng.random() < 0.1:
        request.node.CopyFrom(_node(rng))
    if rng.random() < 0.1:
        request.error_detail.CopyFrom(status_pb2.Status(code=13, message=DETAIL))
    if rng.random() < 0.1:
        request.initial_resource_versions.update({rng.choice(NAMES): rng.choice(["0" * 16, "junk", ""])})
    if rng.random() < 0.02:
        request.resource_names_subscribe.extend(f"n{i}" for i in range(70_000))
    return bytes(request.SerializeToString())


async def _fuzz_stream(server: Server, seed: int, protocol: str, sent: list[int]) -> grpc.StatusCode | None:
    rng = random.Random(seed)
    client = server.delta_client() if protocol == "delta" else server.client()
    nonces: list[str] = []
    try:
        for i in range(rng.randrange(1, 15)):
            sent[0] += 1
            if isinstance(client, DeltaClient):
                client.send_raw(_random_delta(rng, nonces, first=i == 0))
            else:
                client.send_message(_random_sotw(rng, nonces, first=i == 0))
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
