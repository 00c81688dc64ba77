"""Simulated sidecars over delta xDS (DeltaAggregatedResources), as Envoy speaks it.

A stock Istio sidecar (1.22 and later, ``ISTIO_DELTA_XDS``) opens one delta ADS
stream and, as Envoy's delta mux does:

- asks for CDS as a wildcard: the first request carries the node and no names;
- subscribes EDS (``resource_names_subscribe``) to the EDS clusters it got, and
  unsubscribes the ones removed, after ACKing each CDS response;
- once the first EDS response is in, asks for LDS as a wildcard;
- subscribes RDS to the route names its listeners' HTTP connection managers
  name, and unsubscribes the ones no listener names any longer;
- ACKs every response with the ``response_nonce`` alone: no names, no version;
- applies ``removed_resources``;
- keeps what it holds over a dropped stream, and on the next one sends, per
  type, its subscriptions again with ``initial_resource_versions`` of what it
  holds, so a server can leave out what did not change.

Responses are scanned, not parsed (``bench.wirescan``). The runner's marker
(``SimProxy.saw``) works on delta responses unchanged: it looks for bytes.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import grpc

from bench.sidecar import (
    CDS,
    EDS,
    LDS,
    RDS,
    SimProxy,
    identity,
    length_delimited,
    record_end,
    retrieve_outcome,
    send,
)
from bench.wirescan import delta_resource, listener_route_names, scan_delta_response

DELTA_ADS = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
#: The order Envoy's ADS mux sends its subscriptions in on a new stream.
RESUME_ORDER = (CDS, EDS, LDS, RDS)
#: Types subscribed by name; CDS and LDS are wildcards.
EXPLICIT = (EDS, RDS)
#: Seconds a resumed stream stays up before its resumed types count as synced: longer than the
#: server's wait for a rate-limited stream (1 s), after which it would have refused the stream.
RESUME_GRACE = 1.5

#: Route names by listener (name, version), shared by the proxies of a worker process: a listener's
#: bytes are the same for every proxy that gets that version, and parsing them for each would cost
#: the simulator more than the server (a tcp sidecar holds 1,000 listeners).
_ROUTES: dict[tuple[str, str], tuple[str, ...]] = {}


@dataclass
class DeltaProxy(SimProxy):
    """A sidecar's delta state. ``held`` and ``subscribed`` outlive a stream, as Envoy's config does."""

    #: By type: name -> version of every resource held.
    held: dict[str, dict[str, str]] = field(default_factory=lambda: {t: {} for t in RESUME_ORDER})
    #: EDS and RDS: the names subscribed.
    subscribed: dict[str, set[str]] = field(default_factory=lambda: {t: set() for t in EXPLICIT})
    #: By listener name: the RDS names its connection managers hold.
    listener_routes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: Types this proxy has asked for on some stream: the ones it asks for again on a new stream.
    started: set[str] = field(default_factory=set)
    #: Types asked for on the current stream.
    requested: set[str] = field(default_factory=set)
    #: Types asked for on the current stream with versions held: the server may answer nothing.
    resumed: set[str] = field(default_factory=set)
    #: The current stream is open (not ended with a status).
    up: bool = False
    #: Resources received and removals applied, by type, over every stream.
    received: dict[str, int] = field(default_factory=dict)
    removed: dict[str, int] = field(default_factory=dict)

    @property
    def synced(self) -> bool:
        """Every type it wants answered on this stream, or resumed with what it already holds on a
        stream the server kept (a server may send nothing for a type whose versions are current)."""
        wanted = {CDS, LDS} | {t for t in EXPLICIT if self.subscribed[t]}
        done = self.acked
        if self.resumed and self.up and time.time() - self.connected_at > RESUME_GRACE:
            done = done | self.resumed
        return wanted <= done

    def resource_counts(self) -> dict[str, int]:
        return {t: len(names) for t, names in self.held.items() if t in self.started}

    def resource_names(self) -> dict[str, list[str]]:
        return {t: sorted(names) for t, names in self.held.items() if t in self.started}


# -- requests --------------------------------------------------------------------------


def delta_request(
    type_url: str,
    *,
    node: bytes = b"",
    subscribe: Iterable[str] = (),
    unsubscribe: Iterable[str] = (),
    initial_versions: dict[str, str] | None = None,
    nonce: str = "",
) -> bytes:
    """A serialized DeltaDiscoveryRequest, fields in protobuf's order (map entries in dict order)."""
    parts = [length_delimited(1, node)] if node else []
    parts.append(length_delimited(2, type_url.encode()))
    parts += [length_delimited(3, name.encode()) for name in subscribe]
    parts += [length_delimited(4, name.encode()) for name in unsubscribe]
    for name, version in (initial_versions or {}).items():
        entry = length_delimited(1, name.encode()) + (
            length_delimited(2, version.encode()) if version else b""
        )
        parts.append(length_delimited(5, entry))
    if nonce:
        parts.append(length_delimited(6, nonce.encode()))
    return b"".join(parts)


def delta_ack_bytes(type_url: str, nonce: str) -> int:
    """The size of a delta ACK: the type and the nonce, whatever the response held."""
    return len(delta_request(type_url, nonce=nonce))


def opening_requests(proxy: DeltaProxy, node: bytes) -> list[bytes]:
    """What a proxy sends when its stream opens: CDS with the node, then, on a stream after the first,
    every type it had asked for, with its subscriptions and the versions it holds."""
    out = []
    for type_url in RESUME_ORDER:
        if type_url != CDS and type_url not in proxy.started:
            continue
        names = sorted(proxy.subscribed[type_url]) if type_url in EXPLICIT else []
        if type_url in EXPLICIT and not names:
            continue
        held = proxy.held[type_url]
        out.append(
            delta_request(
                type_url,
                node=node if type_url == CDS else b"",
                subscribe=names,
                initial_versions=held,
            )
        )
        proxy.requested.add(type_url)
        proxy.started.add(type_url)
        if held:
            proxy.resumed.add(type_url)
    return out


# -- responses -------------------------------------------------------------------------


def apply_response(proxy: DeltaProxy, data: bytes) -> tuple[str, str]:
    """Apply a DeltaDiscoveryResponse to what the proxy holds; its (type_url, nonce)."""
    type_url, nonce, spans, removed = scan_delta_response(data)
    held = proxy.held.setdefault(type_url, {})
    intern = sys.intern
    for span in spans:
        name, version, resource = delta_resource(data, span)
        name, version = intern(name), intern(version)
        held[name] = version
        if type_url == LDS:
            key = (name, version)
            routes = _ROUTES.get(key)
            if routes is None or not version:
                routes = tuple(listener_route_names(data, resource))
                if version:
                    _ROUTES[key] = routes
            proxy.listener_routes[name] = routes
    for name in removed:
        held.pop(name, None)
        if type_url == LDS:
            proxy.listener_routes.pop(name, None)
    proxy.received[type_url] = proxy.received.get(type_url, 0) + len(spans)
    if removed:
        proxy.removed[type_url] = proxy.removed.get(type_url, 0) + len(removed)
    return type_url, nonce


def follow_up(proxy: DeltaProxy, type_url: str) -> list[bytes]:
    """The requests Envoy sends after ACKing a response of ``type_url``: subscription changes of the
    dependent type, and LDS once the clusters are warm."""
    out = []
    if type_url == CDS:
        clusters = {n for n in proxy.held[CDS] if n.startswith("outbound|")}
        if not clusters and CDS not in proxy.acked:
            proxy.empty_configs += 1
        out += _resubscribe(proxy, EDS, clusters)
        if not proxy.subscribed[EDS]:
            out += _lds(proxy)  # nothing to warm
    elif type_url == EDS:
        out += _lds(proxy)
    elif type_url == LDS:
        out += _resubscribe(proxy, RDS, {r for routes in proxy.listener_routes.values() for r in routes})
    return out


def _resubscribe(proxy: DeltaProxy, type_url: str, wanted: set[str]) -> list[bytes]:
    current = proxy.subscribed[type_url]
    new, gone = sorted(wanted - current), sorted(current - wanted)
    if not new and not gone:
        return []
    proxy.subscribed[type_url] = wanted
    held = proxy.held[type_url]
    for name in gone:
        held.pop(name, None)
    proxy.requested.add(type_url)
    proxy.started.add(type_url)
    return [delta_request(type_url, subscribe=new, unsubscribe=gone)]


def _lds(proxy: DeltaProxy) -> list[bytes]:
    if LDS in proxy.requested:
        return []
    proxy.requested.add(LDS)
    proxy.started.add(LDS)
    return [delta_request(LDS, initial_versions=proxy.held[LDS])]


# -- the stream ------------------------------------------------------------------------


async def run_delta_proxy(proxy: DeltaProxy, channel: grpc.aio.Channel) -> None:
    """Keep one proxy's delta stream up, reconnecting with backoff as Envoy does."""
    node = proxy.spec.node().SerializeToString()
    backoff = 0.5
    while not proxy.stopping:
        # Requests are written from this loop, as in bench.fleet.run_proxy: nothing between
        # reading a response and writing its ACK.
        call = channel.stream_stream(DELTA_ADS, request_serializer=identity, response_deserializer=identity)()
        proxy.connects += 1
        proxy.connected_at = time.time()
        proxy.acked.clear()
        proxy.requested.clear()
        proxy.resumed.clear()
        proxy.up = True

        # Not awaited here (see bench.fleet.run_proxy); awaited before any other write, so writes
        # never overlap.
        opening = asyncio.create_task(send(proxy, call, *opening_requests(proxy, node)))
        opening.add_done_callback(retrieve_outcome)
        try:
            while True:
                data = await call.read()
                if data is grpc.aio.EOF:
                    break
                now = time.time()
                backoff = 0.5
                proxy.bytes_received += len(data)
                if not opening.done():
                    await opening
                type_url, nonce = apply_response(proxy, data)
                proxy.saw(type_url, data, now)
                await send(proxy, call, delta_request(type_url, nonce=nonce), *follow_up(proxy, type_url))
                proxy.acked.add(type_url)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as err:
            if not proxy.stopping:
                await record_end(proxy, call, err)
        finally:
            proxy.up = False
            opening.cancel()
            call.cancel()
        if proxy.stopping:
            return
        await asyncio.sleep(random.uniform(0, backoff))
        backoff = min(backoff * 2, 30.0)
