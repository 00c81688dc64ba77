"""A simulated sidecar's identity and stream state, whatever xDS protocol it speaks.

``bench.fleet`` drives these over state-of-the-world ADS and ``bench.fleet_delta``
over delta ADS; what the runner reads of a proxy (synced, converged on a
marker, bytes, stream ends) is kept here, alike for both.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from google.protobuf import struct_pb2

from meshpilot.networking.wire_py import varint

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
LDS = "type.googleapis.com/envoy.config.listener.v3.Listener"
RDS = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
TYPES = (CDS, EDS, LDS, RDS)
#: Envoy's default initial_stream_window_size.
ENVOY_STREAM_WINDOW = 256 * 1024 * 1024
RETRY_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)
#: The xDS protocols a fleet can speak: state-of-the-world and delta.
PROTOCOLS = ("sotw", "delta")


@dataclass
class ProxySpec:
    node_id: str
    metadata: dict[str, Any]

    def node(self) -> base_pb2.Node:
        meta = struct_pb2.Struct()
        meta.update(self.metadata)
        return base_pb2.Node(id=self.node_id, cluster="bench", metadata=meta)


@dataclass
class SimProxy:
    spec: ProxySpec
    route_names: list[str]
    #: Types ACKed on the current stream.
    acked: set[str] = field(default_factory=set)
    eds_names: list[str] = field(default_factory=list)
    nonces: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    marker: bytes = b""
    marker_type: str = ""
    marker_seen: float | None = None
    connects: int = 0
    #: When the current stream was opened (time.time()).
    connected_at: float = 0.0
    empty_configs: int = 0
    #: Streams that ended with a status, by code (Envoy retries them all, with backoff).
    ended: dict[str, int] = field(default_factory=dict)
    #: The details of the first few, for the report.
    samples: list[str] = field(default_factory=list)
    bytes_received: int = 0
    #: Bytes of every request written (ACKs and subscriptions), over all streams.
    bytes_sent: int = 0
    stopping: bool = False
    #: By type: the names list last requested and its encoded resource_names fields.
    names_encoded: dict[str, tuple[list[str], bytes]] = field(default_factory=dict)
    #: By type: how many resources the first response on the current stream held.
    counts: dict[str, int] = field(default_factory=dict)
    #: By type: the names of those resources, kept only where ``record_names`` (one proxy a worker).
    names: dict[str, list[str]] = field(default_factory=dict)
    record_names: bool = False

    @property
    def synced(self) -> bool:
        wanted = {CDS, EDS, LDS} | ({RDS} if self.route_names else set())
        return wanted <= self.acked

    def resource_counts(self) -> dict[str, int]:
        """By type, the resources this proxy holds (state-of-the-world: the first response's)."""
        return dict(self.counts)

    def resource_names(self) -> dict[str, list[str]]:
        """By type, the names of the resources counted by ``resource_counts`` (``record_names`` only)."""
        return dict(self.names)

    def saw(self, type_url: str, data: bytes, now: float) -> None:
        """Record the arrival of the armed marker, if this response of ``type_url`` carries it."""
        if self.marker and self.marker_seen is None and type_url == self.marker_type and self.marker in data:
            self.marker_seen = now


def identity(payload: bytes) -> bytes:
    return payload


def length_delimited(number: int, value: bytes) -> bytes:
    """One length-delimited protobuf field (tag and length as varints)."""
    return varint((number << 3) | 2) + varint(len(value)) + value


def retrieve_outcome(task: asyncio.Task[None]) -> None:
    """Mark a failed opening write as seen: the stream's read reports the failure."""
    if not task.cancelled():
        task.exception()


async def send(proxy: SimProxy, call: Any, *requests: bytes) -> None:
    """Write requests on the proxy's stream, one after the other, counting their bytes."""
    for request in requests:
        proxy.bytes_sent += len(request)
        await call.write(request)


async def record_end(
    proxy: SimProxy, call: Any, err: grpc.aio.AioRpcError | asyncio.InvalidStateError
) -> None:
    """Count a stream's end by status code, as the report shows them; keep a few details.

    A write to a stream the server already ended raises InvalidStateError; the status is the call's.
    """
    status = err.code() if isinstance(err, grpc.aio.AioRpcError) else await call.code()
    details = err.details() if isinstance(err, grpc.aio.AioRpcError) else await call.details()
    code = status.name
    proxy.ended[code] = proxy.ended.get(code, 0) + 1
    if len(proxy.samples) < 3 and status not in RETRY_CODES:
        proxy.samples.append(f"{code}: {details}")
