"""One ADS stream: the loop that answers requests and delivers pushes, in that priority order."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from meshpilot.model.proxy import InvalidNode, NodeMetadata, locality_label, parse_proxy
from meshpilot.model.push_request import PushRequest, TriggerReason
from meshpilot.networking import wire
from meshpilot.xds import protocol, request_head
from meshpilot.xds.auth import AuthorizationError, authorize
from meshpilot.xds.connection import Connection, WatchedResource
from meshpilot.xds.dependencies import proxy_needs_push
from meshpilot.xds.generators.base import GenerationContext, Generator, digest_of, names_of
from meshpilot.xds.types import PUSH_ORDER, TypeUrl, parse_type_url

if TYPE_CHECKING:
    from meshpilot.xds.server import DiscoveryServer

log = logging.getLogger(__name__)

# Requests are answered before pushes; the end of the stream queues like a request.
_REQUEST, _PUSH, _END = 0, 1, 0
_seq = itertools.count()


@dataclass(frozen=True, slots=True)
class _Incoming:
    """A request as read, with its head scanned once (see ``_scan``)."""

    raw: bytes
    #: (type URL, nonce, hash of the names' bytes) when the head can be read without a parse.
    head: tuple[str, str, int] | None


def _scan(raw: bytes) -> _Incoming:
    try:
        head = request_head.scan(raw)
    except ValueError:
        return _Incoming(raw, None)  # the full parse reports what is wrong
    if head[3] & request_head.FLAG_FULL_PARSE:
        return _Incoming(raw, None)
    # Names as bytes: equal bytes hash alike, so an unchanged ACK needs no parse.
    return _Incoming(raw, (head[0], head[1], hash(raw[head[4] : head[5]])))


class AdsStream:
    """Serves one SotW ADS stream for one proxy."""

    def __init__(
        self,
        server: DiscoveryServer,
        context: grpc.aio.ServicerContext,
        identities: tuple[str, ...] | None = None,
    ) -> None:
        self.server = server
        self.context = context
        #: What the secure port's credential proved; None on the plaintext port (not checked).
        self.identities = identities
        self.events: asyncio.PriorityQueue[tuple[int, int, Any]] = asyncio.PriorityQueue()
        self.conn: Connection | None = None
        #: Chosen once the node is known (its metadata may select other generators).
        self.generators: Mapping[TypeUrl, Generator] = server.generators
        self.closed = False

    # -- setup -------------------------------------------------------------------

    async def run(self, requests: AsyncIterator[bytes]) -> None:
        try:
            raw = await anext(requests)
        except StopAsyncIteration:
            return
        conn = await self._connect(await self._parse(raw))
        self.conn = conn
        self.generators = self.server.generators_for(conn.proxy)
        self.server.add_connection(conn, self)
        reader = asyncio.create_task(self._read(requests))
        try:
            await self._handle_request(_scan(raw))
            await self._loop()
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, ConnectionError) as err:
            # The client went away while we were writing; nothing to answer.
            log.debug("ADS: %s closed while sending: %s", conn.id, err)
        finally:
            self.closed = True
            reader.cancel()
            self.server.remove_connection(conn)
            self._drain_pushes()

    async def _connect(self, request: discovery_pb2.DiscoveryRequest) -> Connection:
        node = request.node
        if not request.HasField("node") or not node.id:
            await self.context.abort(grpc.StatusCode.INVALID_ARGUMENT, "missing node information")
        try:
            raw = json_format.MessageToDict(node.metadata) if node.HasField("metadata") else {}
            metadata = NodeMetadata.parse(raw)
            proxy = parse_proxy(
                node.id,
                metadata,
                default_cluster_id=self.server.options.cluster_id,
                extensions=frozenset(e.name for e in node.extensions),
                locality=locality_label(node.locality.region, node.locality.zone, node.locality.sub_zone),
            )
        except InvalidNode as err:
            await self.context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            raise  # abort raises; this keeps type checkers informed
        verified = ""
        if self.identities is not None:
            try:
                verified = authorize(proxy, self.identities, self.server.trust_domains())
            except AuthorizationError as err:
                self.server.metrics.xds_auth_failures.labels("authorization").inc()
                log.info("ADS: refused %s: %s", node.id, err)
                await self.context.abort(grpc.StatusCode.PERMISSION_DENIED, f"authorization failed: {err}")
                raise
        push = self.server.push_context
        assert push is not None, "streams are accepted only once ready"
        self.server.env.refresh_proxy(proxy, push)
        return Connection(proxy=proxy, peer=self.context.peer(), identity=verified)

    async def _parse(self, raw: bytes) -> discovery_pb2.DiscoveryRequest:
        try:
            return discovery_pb2.DiscoveryRequest.FromString(raw)
        except DecodeError as err:
            await self.context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed DiscoveryRequest: {err}")
            raise  # abort raises; this keeps type checkers informed

    async def _read(self, requests: AsyncIterator[bytes]) -> None:
        events = self.events
        try:
            async for raw in requests:
                incoming = _scan(raw)
                # Most requests are ACKs that change nothing; recording them here spares a
                # trip through the queue and a wake-up of the loop for every proxy of a push.
                # Only when nothing is queued: requests are handled in the order they came.
                if events.empty() and self._quiet_ack(incoming):
                    continue
                events.put_nowait((_REQUEST, next(_seq), incoming))
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        except Exception:
            log.exception("reading ADS stream failed")
        finally:
            self.events.put_nowait((_END, next(_seq), None))

    # -- the loop ----------------------------------------------------------------

    def deliver(self, request: PushRequest, done: Callable[[], None]) -> None:
        """Hand a push to this stream; ``done`` is called once it was handled (or dropped)."""
        if self.closed:
            done()
            return
        self.events.put_nowait((_PUSH, next(_seq), (request, done)))

    async def _loop(self) -> None:
        while True:
            _, _, item = await self.events.get()
            if item is None:
                return
            if isinstance(item, _Incoming):
                await self._handle_request(item)
                continue
            request, done = item
            try:
                await self._push(request)
            finally:
                done()

    def _drain_pushes(self) -> None:
        while not self.events.empty():
            _, _, item = self.events.get_nowait()
            if isinstance(item, tuple):
                item[1]()

    # -- requests ----------------------------------------------------------------

    def _quiet_ack(self, incoming: _Incoming) -> bool:
        """Record the request if it is an ACK that needs nothing else (see ``protocol.quiet_ack``)."""
        assert self.conn is not None
        return incoming.head is not None and protocol.quiet_ack(self.conn, *incoming.head)

    async def _handle_request(self, incoming: _Incoming) -> None:
        conn = self.conn
        assert conn is not None
        if self._quiet_ack(incoming):
            return
        digest = incoming.head[2] if incoming.head is not None else None
        request = await self._parse(incoming.raw)
        type_url = request.type_url
        if type_url == TypeUrl.HEALTH:
            return
        error = request.error_detail.message if request.HasField("error_detail") else None
        decision = protocol.decide(
            conn, type_url, list(request.resource_names), request.response_nonce, error, digest
        )
        metrics = self.server.metrics
        known = parse_type_url(type_url)
        short = known.short if known is not None else type_url
        if decision.verdict is protocol.Verdict.NACK:
            metrics.xds_rejects.labels(type=short).inc()
            log.warning(
                "ADS:%s: %s rejected by %s (nonce %s): %s",
                short.upper(),
                conn.id,
                conn.peer,
                request.response_nonce,
                error,
            )
            return
        if decision.verdict is protocol.Verdict.STALE:
            metrics.expired_nonce.labels(type=short).inc()
            return
        if not decision.respond:
            return
        push = self.server.push_context
        assert push is not None
        generate_request = PushRequest(full=True, reasons=_counter(TriggerReason.PROXY), push=push)
        await self._send(type_url, generate_request, decision.names, pushed=False)

    # -- pushes ------------------------------------------------------------------

    async def _push(self, request: PushRequest) -> None:
        conn = self.conn
        assert conn is not None and request.push is not None
        env = self.server.env
        if request.full:
            env.refresh_proxy(conn.proxy, request.push)
        if not proxy_needs_push(conn.proxy, request, request.push.mesh.root_namespace):
            return
        ordered: list[str] = [t for t in PUSH_ORDER if t in conn.watched]
        ordered += [t for t in conn.watched if t not in ordered]
        for type_url in ordered:
            known = parse_type_url(type_url)
            generator = self.generators.get(known) if known is not None else None
            if generator is None or not generator.needs_push(request):
                continue
            await self._send(type_url, request, None, pushed=True)
        self.server.metrics.convergence_time.observe(time.monotonic() - request.start)

    async def _send(
        self, type_url: str, request: PushRequest, names: frozenset[str] | None, *, pushed: bool
    ) -> None:
        conn = self.conn
        assert conn is not None and request.push is not None
        watch = conn.watched.get(type_url)
        known = parse_type_url(type_url)
        generator = self.generators.get(known) if known is not None else None
        if watch is None or generator is None:
            return
        started = time.monotonic()
        ctx = GenerationContext(
            conn.proxy, request.push, self.server.env.index, request, self.server.cache, conn.identity
        )
        try:
            resources = generator.generate(ctx, watch, names)
        except Exception:
            self.server.metrics.internal_errors.inc()
            log.exception("generating %s for %s failed", type_url, conn.id)
            return
        if resources is None:
            return
        assert known is not None
        metrics = self.server.metrics
        # The whole watched state, or only part of it (an endpoint push, added names)?
        whole = (names is None and request.full) or known.is_wildcard or names == watch.names
        digest = digest_of(resources) if whole else None
        if pushed and digest is not None and digest == watch.digest_sent:
            # SotW lets a server stay silent when nothing changed; Envoy would
            # only compare and drop the same config again.
            metrics.for_type(known.short).unchanged_skipped.inc()
            return
        version = request.push.version
        # Unique per response; 16 random bytes cost a fifth of a uuid4 object.
        nonce = f"{version}-{os.urandom(16).hex()}"
        payload = wire.discovery_response(version, type_url, nonce, [r.payload for r in resources])
        by_type = metrics.for_type(known.short)
        by_type.push_time.observe(time.monotonic() - started)
        if known is TypeUrl.CLUSTER:
            eds = conn.watched.get(TypeUrl.ENDPOINT)
            if eds is not None:
                # Changed clusters warm until they get endpoints; Envoy's next EDS
                # request may name the same clusters and still needs an answer. Set
                # before the write: the reader may see that request before the write
                # returns, and must not take it for a quiet ACK.
                eds.always_respond = True
        sent_at = time.monotonic()
        await self.context.write(payload)
        metrics.send_time.observe(time.monotonic() - sent_at)
        by_type.pushes.inc()
        by_type.config_size.observe(len(payload))
        _record_sent(
            watch, version, nonce, names_of(resources), partial=names is not None or not request.full
        )
        watch.digest_sent = digest


def _record_sent(
    watch: WatchedResource, version: str, nonce: str, names: frozenset[str], *, partial: bool
) -> None:
    watch.nonce_sent = nonce
    watch.version_sent = version
    watch.last_sent = time.time()
    if not partial:
        watch.sent_names = names
    elif not names <= watch.sent_names:
        # An endpoint push usually resends names the proxy has: no new set then.
        watch.sent_names = watch.sent_names | names


def _counter(reason: TriggerReason) -> Counter[TriggerReason]:
    return Counter({reason: 1})
