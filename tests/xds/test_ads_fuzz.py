"""ADS, both protocols, under hostile and random requests: each stream ends with a clear status or
keeps going; the server never fails inside, and an ordinary proxy keeps being served throughout."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from envoy.service.discovery.v3 import discovery_pb2
from google.rpc import status_pb2
from support.ads_client import DeltaClient, lost_status, node
from support.kube import workload, write
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
#: How a stream may end: a refusal the server chose, not a failure.
CLEAR = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    async with three_services(tmp_path) as served:
        yield served


def _random_sotw(rng: random.Random, nonces: list[str], first: bool) -> discovery_pb2.DiscoveryRequest:
    request = discovery_pb2.DiscoveryRequest(
        type_url=rng.choice(TYPES),
        resource_names=rng.sample(NAMES, rng.randrange(0, 3)),
        response_nonce=rng.choice([*nonces, "", "stale-nonce"]) if nonces else rng.choice(["", "x"]),
    )
    if first or rng.random() < 0.1:
        request.node.CopyFrom(node(NODE if rng.random() < 0.9 else ""))
    if rng.random() < 0.1:
        request.error_detail.CopyFrom(status_pb2.Status(code=13, message="nack"))
    if rng.random() < 0.02:
        request.resource_names.extend(f"n{i}" for i in range(70_000))
    return request


def _random_delta(rng: random.Random, nonces: list[str], first: bool) -> bytes:
    if rng.random() < 0.05:
        return rng.randbytes(rng.randrange(1, 64))  # not a DeltaDiscoveryRequest at all
    request = discovery_pb2.DeltaDiscoveryRequest(
        type_url=rng.choice(TYPES),
        resource_names_subscribe=rng.sample(NAMES, rng.randrange(0, 3)),
        resource_names_unsubscribe=rng.sample(NAMES, rng.randrange(0, 2)),
        response_nonce=rng.choice([*nonces, "", "stale-nonce"]) if nonces else rng.choice(["", "x"]),
    )
    if first or rng.random() < 0.1:
        request.node.CopyFrom(node(NODE if rng.random() < 0.9 else ""))
    if rng.random() < 0.1:
        request.error_detail.CopyFrom(status_pb2.Status(code=13, message="nack"))
    if rng.random() < 0.1:
        request.initial_resource_versions.update({rng.choice(NAMES): rng.choice(["0" * 16, "junk", ""])})
    if rng.random() < 0.02:
        request.resource_names_subscribe.extend(f"n{i}" for i in range(70_000))
    return bytes(request.SerializeToString())


async def _fuzz_stream(server: Server, seed: int, protocol: str) -> grpc.StatusCode | None:
    rng = random.Random(seed)
    client = server.delta_client() if protocol == "delta" else server.client()
    nonces: list[str] = []
    try:
        for i in range(rng.randrange(1, 15)):
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

    ends = [await _fuzz_stream(server, seed, protocol) for seed in range(40)]
    unclear = [(seed, code) for seed, code in enumerate(ends) if code is not None and code not in CLEAR]
    assert not unclear, f"streams ended with statuses that are not a refusal: {unclear}"
    assert any(code in CLEAR for code in ends), "some of the random requests must have been refused"
    assert server.metric("pilot_total_xds_internal_errors_total") == 0

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
