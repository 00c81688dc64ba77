"""A flood of random and hostile ADS requests over the wire, both protocols, from a process of its own.

The requests are what a broken or hostile client sends: made-up type URLs (each new one would be a
metric series if it became a label), stale and unknown nonces, NACKs with 64 KB details that try to
forge log lines, names of 70 KB, 70,000 subscriptions at once, 1 MB node IDs, deeply nested
``POD_PORTS``, random bytes that are not a request at all. The oversized parts come with a chance of
their own (``heavy``): the in-process fuzz test sends them often, to see each refused clearly; a
flood of a hundred thousand messages sends them rarely, so that it measures the server under many
bad messages rather than the loopback's bandwidth.

``python -m bench.ads_flood --target HOST:PORT --messages N`` prints a JSON summary (messages sent,
streams, how the streams ended, seconds). ``tests/integration/test_ads_flood.py`` runs 100,000
messages against a server process with a canary proxy; ``python -m bench.ads_flood --bench`` runs a
million against a server it starts, and writes ``bench/results/ads-flood.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import struct_pb2
from google.rpc import status_pb2

ADS_METHOD = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
DELTA_METHOD = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
METHODS = {"sotw": ADS_METHOD, "delta": DELTA_METHOD}

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
LDS = "type.googleapis.com/envoy.config.listener.v3.Listener"
RDS = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
TYPES = [CDS, EDS, LDS, RDS, "type.googleapis.com/no.such.Type", "", "istio.io/debug/syncz"]
#: A proxy of the fuzz tests' three-service mesh (``support.xds_server.three_services``).
NODE = "sidecar~127.0.0.11~productpage-v1.default~default.svc.cluster.local"
NAMES = [
    "*",
    "outbound|9080||reviews.default.svc.cluster.local",
    "outbound|9080||ratings.default.svc.cluster.local",
    "9080",
    "",
    "\u00e9\u4e2d",
]
#: Over the server's 16 KiB limit on one resource name.
LONG_NAME = "x" * 70_000
#: A NACK detail as a hostile client writes it: long, and with line breaks that would forge log lines.
DETAIL = "bad cluster\n2026-01-01T00:00:00Z\terror\tforged line " + "x" * 65_536
#: How a stream may end: the client's own close (OK), or a refusal the server chose
#: (UNAUTHENTICATED: a debug type asked for on the plaintext port, as istiod refuses it), or
#: ENDED_WHILE_WRITING: the server ended the stream while the client was still writing, which grpc's
#: asyncio client reports as INTERNAL "Internal error from Core" in place of the server's status
#: (grpc/grpc#36066); the server's own count of internal errors tells it apart from a real one.
CLEAR = frozenset({"OK", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "UNAUTHENTICATED", "ENDED_WHILE_WRITING"})
#: What grpc's asyncio client says when a write fails after the server's status (see CLEAR).
_WRITE_AFTER_END = "Internal error from Core"


def node(node_id: str, metadata: dict[str, str]) -> base_pb2.Node:
    meta = struct_pb2.Struct()
    meta.update(metadata)
    return base_pb2.Node(id=node_id, cluster="test", metadata=meta)


@dataclass(frozen=True, slots=True)
class Mix:
    """How often a request carries each oversized part (the rest are small)."""

    heavy: float = 0.1

    def roll(self, rng: random.Random, base: float) -> bool:
        return rng.random() < base * self.heavy * 10


def _type_url(rng: random.Random) -> str:
    if rng.random() < 0.2:  # a new one every time
        return f"type.googleapis.com/fuzz.T{rng.getrandbits(64):x}"
    return rng.choice(TYPES)


def _names(rng: random.Random, mix: Mix, most: int) -> list[str]:
    names = rng.sample(NAMES, rng.randrange(0, most))
    if mix.roll(rng, 0.01):
        names.append(LONG_NAME)
    return names


def _node(rng: random.Random, mix: Mix) -> base_pb2.Node:
    roll = rng.random()
    if roll < 0.05:
        return node("", {})
    if mix.roll(rng, 0.05):
        return node("sidecar~" + "1" * 1_000_000, {})  # echoed whole, the status would not fit a header
    metadata: dict[str, str] = {
        "NAMESPACE": "default",
        "INTERCEPTION_MODE": "NONE",
        "ISTIO_VERSION": rng.choice(["1.28.0", f"1.{rng.randrange(10**6)}.0", f"v{rng.getrandbits(64):x}"]),
    }
    if mix.roll(rng, 0.1):
        metadata["POD_PORTS"] = "[" * 100_000 + "]" * 100_000
    return node(NODE, metadata)


def _nonce(rng: random.Random, nonces: Sequence[str]) -> str:
    return rng.choice([*nonces[-4:], "", "stale-nonce"]) if nonces else rng.choice(["", "x"])


def random_sotw(rng: random.Random, nonces: Sequence[str], *, first: bool, mix: Mix = Mix()) -> bytes:
    request = discovery_pb2.DiscoveryRequest(
        type_url=_type_url(rng), resource_names=_names(rng, mix, 3), response_nonce=_nonce(rng, nonces)
    )
    if first or rng.random() < 0.1:
        request.node.CopyFrom(_node(rng, mix))
    if mix.roll(rng, 0.1):
        request.error_detail.CopyFrom(status_pb2.Status(code=13, message=DETAIL))
    if mix.roll(rng, 0.02):
        request.resource_names.extend(f"n{i}" for i in range(70_000))
    return bytes(request.SerializeToString())


def random_delta(rng: random.Random, nonces: Sequence[str], *, first: bool, mix: Mix = Mix()) -> bytes:
    if rng.random() < 0.05:
        return rng.randbytes(rng.randrange(1, 64))  # not a DeltaDiscoveryRequest at all
    request = discovery_pb2.DeltaDiscoveryRequest(
        type_url=_type_url(rng),
        resource_names_subscribe=_names(rng, mix, 3),
        resource_names_unsubscribe=rng.sample(NAMES, rng.randrange(0, 2)),
        response_nonce=_nonce(rng, nonces),
    )
    if first or rng.random() < 0.1:
        request.node.CopyFrom(_node(rng, mix))
    if mix.roll(rng, 0.1):
        request.error_detail.CopyFrom(status_pb2.Status(code=13, message=DETAIL))
    if rng.random() < 0.1:
        request.initial_resource_versions.update({rng.choice(NAMES): rng.choice(["0" * 16, "junk", ""])})
    if mix.roll(rng, 0.02):
        request.resource_names_subscribe.extend(f"n{i}" for i in range(70_000))
    return bytes(request.SerializeToString())


GENERATORS = {"sotw": random_sotw, "delta": random_delta}
RESPONSES = {"sotw": discovery_pb2.DiscoveryResponse, "delta": discovery_pb2.DeltaDiscoveryResponse}


@dataclass
class FloodResult:
    messages: int = 0
    streams: int = 0
    #: How the streams ended, by gRPC status name ("TIMEOUT": no status within the wait).
    ends: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    def unclear(self) -> dict[str, int]:
        return {code: n for code, n in self.ends.items() if code not in CLEAR}


async def _one_stream(
    channel: grpc.aio.Channel, protocol: str, rng: random.Random, count: int, mix: Mix, result: FloodResult
) -> None:
    """Send ``count`` random requests on one stream, reading its responses meanwhile; then half-close
    and wait for the server's status."""
    nonces: list[str] = []
    generate = GENERATORS[protocol]
    response_type = RESPONSES[protocol]

    async def requests() -> AsyncIterator[bytes]:
        for i in range(count):
            result.messages += 1
            yield generate(rng, nonces, first=i == 0, mix=mix)
            await asyncio.sleep(0)

    # Bytes both ways: some requests are not protobuf at all, and responses are parsed only for nonces.
    call = channel.stream_stream(METHODS[protocol])(requests())
    result.streams += 1

    async def read() -> None:
        async for raw in call:
            with contextlib.suppress(Exception):
                nonces.append(response_type.FromString(raw).nonce)

    try:
        await asyncio.wait_for(read(), timeout=30)
        result.ends[(await call.code()).name] += 1
    except grpc.aio.AioRpcError as err:
        late_write = err.code() == grpc.StatusCode.INTERNAL and err.details() == _WRITE_AFTER_END
        result.ends["ENDED_WHILE_WRITING" if late_write else err.code().name] += 1
    except TimeoutError:
        call.cancel()
        result.ends["TIMEOUT"] += 1


async def flood(
    target: str,
    messages: int,
    *,
    seed: int = 0,
    concurrency: int = 32,
    protocols: Sequence[str] = ("delta", "sotw"),
    mix: Mix = Mix(heavy=0.01),
    longest_stream: int = 30,
) -> FloodResult:
    """Send about ``messages`` random requests over streams of 1 to ``longest_stream`` requests,
    ``concurrency`` streams at a time, alternating the protocols."""
    result = FloodResult()
    rng = random.Random(seed)
    started = time.monotonic()
    # Large enough for the 1 MB node IDs; the server decides what it accepts.
    options = [("grpc.max_send_message_length", 8 << 20), ("grpc.max_receive_message_length", 64 << 20)]
    async with grpc.aio.insecure_channel(target, options=options) as channel:
        pending: set[asyncio.Task[None]] = set()
        # Streams the server ends early send fewer than planned: plan again until enough were sent.
        while result.messages < messages:
            while len(pending) >= concurrency:
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            count = rng.randrange(1, longest_stream + 1)
            protocol = protocols[result.streams % len(protocols)]
            stream_rng = random.Random(rng.getrandbits(64))
            pending.add(asyncio.ensure_future(_one_stream(channel, protocol, stream_rng, count, mix, result)))
        if pending:
            await asyncio.wait(pending)
    result.seconds = time.monotonic() - started
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ads_flood", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, help="HOST:PORT of a plaintext ADS server")
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--heavy", type=float, default=0.01, help="weight of the oversized parts (0..1)")
    args = parser.parse_args(argv)
    result = asyncio.run(
        flood(args.target, args.messages, seed=args.seed, concurrency=args.concurrency, mix=Mix(args.heavy))
    )
    summary = asdict(result)
    summary["ends"] = dict(result.ends)
    json.dump(summary, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
