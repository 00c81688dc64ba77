"""One proxy's config fetched over a stream of its own, and which process of a push-worker pool
served it: for comparing the bytes a pool's workers serve with those of a single process.

The stream asks as its client does (golden.generate's order): a sidecar takes clusters and
listeners whole, then the routes its listeners name and the endpoints of its EDS clusters; a
proxyless gRPC client asks for its listeners by name, then their routes, the routes' clusters and
their endpoints. It acknowledges every response and keeps the last bytes of each resource.

Each fetch opens a TCP connection of its own (``grpc.use_local_subchannel_pool``): gRPC otherwise
shares one connection between every channel to the same target in a process, and the kernel's
SO_REUSEPORT spreading, which picks a worker per connection, would send every stream to one worker.
Which worker took the connection is read from the kernel (``pool_sockets``).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2, json_format, struct_pb2
from support.ads_client import ADS_METHOD, DELTA_METHOD
from support.golden import rds_names, route_clusters
from support.pool_sockets import ServerSockets

from meshpilot.networking.envoyfilter.values import knows_type
from meshpilot.xds.types import TypeUrl

_MESSAGES: dict[TypeUrl, Any] = {
    TypeUrl.CLUSTER: cluster_pb2.Cluster,
    TypeUrl.LISTENER: listener_pb2.Listener,
    TypeUrl.ROUTE: route_pb2.RouteConfiguration,
    TypeUrl.ENDPOINT: endpoint_pb2.ClusterLoadAssignment,
}


# -- one proxy's config over one stream ------------------------------------------------------------


@dataclass
class Served:
    """What one stream received: type -> name -> bytes, the version each response carried, and (delta)
    each resource's version."""

    resources: dict[TypeUrl, dict[str, bytes]] = field(default_factory=dict)
    versions: dict[TypeUrl, set[str]] = field(default_factory=dict)
    resource_versions: dict[TypeUrl, dict[str, str]] = field(default_factory=dict)
    #: The pid of the server process that held the stream (0 when not asked).
    process: int = 0

    def as_json(self) -> dict[str, list[dict[str, Any]]]:
        """As golden.generate writes a proxy's resources (for a readable difference)."""
        out = {}
        for type_url, key in (
            (TypeUrl.CLUSTER, "clusters"),
            (TypeUrl.LISTENER, "listeners"),
            (TypeUrl.ROUTE, "routes"),
            (TypeUrl.ENDPOINT, "endpoints"),
        ):
            dicts = []
            for value in self.resources.get(type_url, {}).values():
                dicts.append(as_dict(any_pb2.Any(type_url=type_url.value, value=value)))
            out[key] = sorted(dicts, key=lambda d: d.get("name") or d.get("cluster_name") or "")
        return out


class _Stream:
    def __init__(self, target: str, delta: bool, node_id: str, metadata: dict[str, Any]) -> None:
        self.delta = delta
        meta = struct_pb2.Struct()
        meta.update(metadata)
        # No node.cluster: golden.generate's proxies have none (a gateway's tracing service name
        # would come from it).
        self.node = base_pb2.Node(id=node_id, metadata=meta)
        self.channel = grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
        self._out: asyncio.Queue[bytes | None] = asyncio.Queue()
        response = (
            discovery_pb2.DeltaDiscoveryResponse.FromString
            if delta
            else discovery_pb2.DiscoveryResponse.FromString
        )
        self.call = self.channel.stream_stream(
            DELTA_METHOD if delta else ADS_METHOD,
            request_serializer=lambda raw: raw,
            response_deserializer=response,
        )(self._requests())
        self.served = Served()
        self._first = True
        self._asked: dict[TypeUrl, list[str]] = {}

    async def _requests(self) -> AsyncIterator[bytes]:
        while (item := await self._out.get()) is not None:
            yield item

    def _send(self, type_url: TypeUrl, names: list[str], nonce: str = "", version: str = "") -> None:
        if self.delta:
            delta = discovery_pb2.DeltaDiscoveryRequest(
                type_url=type_url.value,
                resource_names_subscribe=[] if nonce else names,
                response_nonce=nonce,
            )
            if self._first:
                delta.node.CopyFrom(self.node)
            raw = delta.SerializeToString()
        else:
            sotw = discovery_pb2.DiscoveryRequest(
                type_url=type_url.value, resource_names=names, response_nonce=nonce, version_info=version
            )
            if self._first:
                sotw.node.CopyFrom(self.node)
            raw = sotw.SerializeToString()
        self._first = False
        self._out.put_nowait(raw)

    async def ask(self, type_url: TypeUrl, names: list[str], timeout: float) -> None:
        """Subscribe, then read (and acknowledge) responses until one of ``type_url`` came."""
        self._asked[type_url] = names
        self._send(type_url, names)
        while True:
            response = await asyncio.wait_for(self.call.read(), timeout)
            if response is grpc.aio.EOF:
                raise AssertionError(f"the server ended the stream while {type_url.short} was asked")
            got = TypeUrl(response.type_url)
            self._apply(got, response)
            if got is type_url:
                return

    def _apply(self, type_url: TypeUrl, response: Any) -> None:
        held = self.served.resources.setdefault(type_url, {})
        if self.delta:
            versions = self.served.resource_versions.setdefault(type_url, {})
            for r in response.resources:
                held[r.name] = r.resource.value
                versions[r.name] = r.version
            for name in response.removed_resources:
                held.pop(name, None)
                versions.pop(name, None)
            self.served.versions.setdefault(type_url, set()).add(response.system_version_info)
            self._send(type_url, [], nonce=response.nonce)
        else:
            got = {_name(type_url, r.value): r.value for r in response.resources}
            if type_url.is_wildcard:
                held.clear()
            held.update(got)
            self.served.versions.setdefault(type_url, set()).add(response.version_info)
            self._send(type_url, self._asked.get(type_url, []), response.nonce, response.version_info)

    async def close(self) -> None:
        self._out.put_nowait(None)
        self.call.cancel()
        await self.channel.close()


def _name(type_url: TypeUrl, value: bytes) -> str:
    message = _MESSAGES[type_url].FromString(value)
    return str(message.cluster_name if type_url is TypeUrl.ENDPOINT else message.name)


def as_dict(message: Any) -> dict[str, Any]:
    """``message`` as JSON, its nested ``Any`` types imported as needed (an EnvoyFilter may insert
    filters, such as Lua, that nothing in this process has imported)."""
    while True:
        try:
            return dict(json_format.MessageToDict(message, preserving_proto_field_name=True))
        except TypeError as err:
            unknown = re.search(r"type_url: type\.googleapis\.com/(\S+)", str(err))
            if unknown is None or not knows_type(unknown.group(1)):
                raise


def _dicts(type_url: TypeUrl, values: Iterable[bytes]) -> list[dict[str, Any]]:
    return [as_dict(_MESSAGES[type_url].FromString(v)) for v in values]


def route_names(listeners: Iterable[bytes]) -> set[str]:
    """The route configurations serialized listeners name (RDS)."""
    return set(rds_names(_dicts(TypeUrl.LISTENER, listeners)))


def routed_clusters(routes: Iterable[bytes]) -> set[str]:
    """The clusters serialized route configurations name (what a proxyless client asks for)."""
    return set(route_clusters(_dicts(TypeUrl.ROUTE, routes)))


def eds_clusters(clusters: Iterable[bytes]) -> set[str]:
    """The names of the EDS clusters among serialized clusters."""
    out = set()
    for value in clusters:
        cluster = cluster_pb2.Cluster.FromString(value)
        if cluster.type == cluster_pb2.Cluster.EDS:
            out.add(cluster.name)
    return out


async def fetch(
    target: str,
    node_id: str,
    metadata: dict[str, Any],
    *,
    delta: bool,
    listeners: list[str] | None = None,
    server: tuple[int, int] | None = None,
    timeout: float = 10.0,
) -> Served:
    """The proxy's config, asked for over a new connection. ``listeners``: a proxyless gRPC client's.
    ``server``: (the server's root pid, its xDS port), to find which of its processes served."""
    before = ServerSockets.read(*server) if server is not None else None
    stream = _Stream(target, delta, node_id, metadata)
    served = stream.served
    try:
        if listeners is None:
            await stream.ask(TypeUrl.CLUSTER, [], timeout)
            if before is not None:
                assert server is not None
                served.process = _taker(before, ServerSockets.read(*server))
            await stream.ask(TypeUrl.LISTENER, [], timeout)
            routes = route_names(served.resources[TypeUrl.LISTENER].values())
            if routes:
                await stream.ask(TypeUrl.ROUTE, sorted(routes), timeout)
        else:
            await stream.ask(TypeUrl.LISTENER, listeners, timeout)
            if before is not None:
                assert server is not None
                served.process = _taker(before, ServerSockets.read(*server))
            routes = route_names(served.resources[TypeUrl.LISTENER].values())
            if routes:
                await stream.ask(TypeUrl.ROUTE, sorted(routes), timeout)
            routed = routed_clusters(served.resources.get(TypeUrl.ROUTE, {}).values())
            await stream.ask(TypeUrl.CLUSTER, sorted(routed), timeout)
        eds = sorted(eds_clusters(served.resources[TypeUrl.CLUSTER].values()))
        if eds:
            await stream.ask(TypeUrl.ENDPOINT, eds, timeout)
    finally:
        await stream.close()
    return served


def _taker(before: ServerSockets, after: ServerSockets) -> int:
    taken = after.taken_since(before)
    assert len(taken) == 1, f"expected one server process to accept the stream, saw {taken}"
    return taken.pop()
