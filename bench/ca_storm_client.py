"""One workload of the certificate storm, in a client process: CreateCertificate for a fresh CSR,
then an ADS stream for its own node, retrying with Envoy's backoff."""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.connection
import random
import time
from dataclasses import asdict, dataclass
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import struct_pb2

from meshpilot._proto.istio.security.v1alpha1 import ca_pb2, ca_pb2_grpc
from meshpilot.server import gc_tuning

ISTIOD_NAME = "istiod.istio-system.svc"
ADS = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
#: Statuses a workload asks again after, with backoff (as Envoy and istio-agent do after any failure):
#: the stream rate limit, a server not reachable, and CANCELLED, which grpc.aio's client reports for
#: some calls of a storm that no server counter saw (counted apart, as "refused otherwise").
RETRY = frozenset({"RESOURCE_EXHAUSTED", "UNAVAILABLE", "CANCELLED"})
#: grpc/grpc#36066: grpc.aio's client sometimes reports a refused stream as INTERNAL with this text.
LOST_STATUS = "Internal error from Core"
#: How a refusal by the stream rate limit reaches the client.
RATE_LIMIT_CODES = ("RESOURCE_EXHAUSTED", "INTERNAL (lost status)")


@dataclass(frozen=True)
class Workload:
    node_id: str
    metadata: dict[str, Any]
    #: The mesh certificate held before the storm: key and chain (leaf first, without the root).
    key_pem: str
    chain_pem: str
    #: The fresh CSR it asks to have signed.
    csr_pem: str


@dataclass
class Outcome:
    cert_at: float | None = None
    served_at: float | None = None
    empty: bool = False
    cert_attempts: int = 0
    stream_attempts: int = 0
    #: Statuses seen, "<phase> <code>" -> count (a lost status: "ads INTERNAL (lost status)").
    refused: dict[str, int] | None = None
    #: The details of the first refusal not by the rate limit.
    sample: str | None = None

    def count(self, phase: str, code: str, details: str | None = None) -> None:
        self.refused = self.refused or {}
        key = f"{phase} {code}"
        self.refused[key] = self.refused.get(key, 0) + 1
        if self.sample is None and code not in RATE_LIMIT_CODES:
            self.sample = f"{key} at {time.time():.1f}: {details}"


def _node(workload: Workload) -> base_pb2.Node:
    metadata = struct_pb2.Struct()
    metadata.update(workload.metadata)
    return base_pb2.Node(id=workload.node_id, cluster="bench", metadata=metadata)


def _code(err: grpc.aio.AioRpcError) -> str:
    if err.code() is grpc.StatusCode.INTERNAL and err.details() == LOST_STATUS:
        return "INTERNAL (lost status)"
    return str(err.code().name)


async def _backoff(ceiling: float) -> float:
    """Envoy's xDS retry (istio-agent's CA client retries alike): a random wait under a ceiling that
    doubles from 0.5 s to 30 s."""
    await asyncio.sleep(random.uniform(0, ceiling))
    return min(ceiling * 2, 30.0)


async def _one(workload: Workload, channel: grpc.aio.Channel, deadline: float) -> Outcome:
    outcome = Outcome()
    create = ca_pb2_grpc.IstioCertificateServiceStub(channel).CreateCertificate  # type: ignore[no-untyped-call]
    ceiling = 0.5
    while time.time() < deadline:
        outcome.cert_attempts += 1
        try:
            response = await create(
                ca_pb2.IstioCertificateRequest(csr=workload.csr_pem, validity_duration=86400),
                timeout=max(1.0, deadline - time.time()),
            )
        except grpc.aio.AioRpcError as err:
            code = _code(err)
            outcome.count("csr", code, err.details())
            if code not in RETRY and code != "INTERNAL (lost status)":
                return outcome
            ceiling = await _backoff(ceiling)
            continue
        if response.cert_chain:
            outcome.cert_at = time.time()
        break
    if outcome.cert_at is None:
        return outcome
    request = discovery_pb2.DiscoveryRequest(type_url=CDS, node=_node(workload)).SerializeToString()
    ceiling = 0.5
    while time.time() < deadline:
        outcome.stream_attempts += 1
        call = channel.stream_stream(ADS, request_serializer=bytes, response_deserializer=bytes)()
        # Not awaited before the read: a refused stream's status comes back through the read.
        opening = asyncio.create_task(call.write(request))
        opening.add_done_callback(lambda t: t.cancelled() or t.exception())
        try:
            data = await asyncio.wait_for(call.read(), max(1.0, deadline - time.time()))
        except grpc.aio.AioRpcError as err:
            code = _code(err)
            outcome.count("ads", code, err.details())
            if code not in RETRY and code != "INTERNAL (lost status)":
                return outcome
            ceiling = await _backoff(ceiling)
            continue
        except (asyncio.InvalidStateError, TimeoutError):
            outcome.count("ads", "no answer")
            ceiling = await _backoff(ceiling)
            continue
        finally:
            opening.cancel()
            call.cancel()
        if data is grpc.aio.EOF:
            outcome.count("ads", "ended without a response")
            ceiling = await _backoff(ceiling)
            continue
        response = discovery_pb2.DiscoveryResponse.FromString(data)
        outcome.served_at = time.time()
        outcome.empty = response.type_url != CDS or not response.resources
        break
    return outcome


async def _storm_worker(
    conn: multiprocessing.connection.Connection, target: str, root_pem: bytes, workloads: list[Workload]
) -> None:
    # One channel per workload, each with its own certificate, so its own TLS connection; made before
    # the storm, but they connect only when the first call is made.
    channels = [
        grpc.aio.secure_channel(
            target,
            grpc.ssl_channel_credentials(root_pem, w.key_pem.encode(), w.chain_pem.encode()),
            options=[("grpc.ssl_target_name_override", ISTIOD_NAME), ("grpc.use_local_subchannel_pool", 1)],
        )
        for w in workloads
    ]
    conn.send("ready")
    loop = asyncio.get_running_loop()
    _, deadline = await loop.run_in_executor(None, conn.recv)
    outcomes = await asyncio.gather(*(_one(w, c, deadline) for w, c in zip(workloads, channels, strict=True)))
    await asyncio.gather(*(c.close() for c in channels))
    conn.send([asdict(o) for o in outcomes])


def worker_main(
    conn: multiprocessing.connection.Connection, target: str, root_pem: bytes, workloads: list[Workload]
) -> None:
    gc_tuning.configure()
    asyncio.run(_storm_worker(conn, target, root_pem, workloads))
