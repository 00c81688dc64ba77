"""One ADS stream, either protocol: the loop that answers requests and delivers pushes, in that order.

The protocol-neutral part lives here: the node and its authorization, the
event loop (requests before pushes), the push decision and the generation.
``SotwStream`` and ``DeltaStream`` add how requests are read and decided
(``protocol``, ``delta_protocol``: pure rules) and how responses are written.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, NoReturn

import grpc
from envoy.config.core.v3 import base_pb2
from google.protobuf import json_format

from meshpilot.bounded_logs import DETAIL_CHARS, STATUS_CHARS, WarningBudget, clip
from meshpilot.model.proxy import InvalidNode, NodeMetadata, locality_label, parse_proxy
from meshpilot.model.push_request import PushRequest, TriggerReason
from meshpilot.push.history import ProxyPush, TypeSent
from meshpilot.xds.auth import AuthorizationError, authorize
from meshpilot.xds.cache import new_token
from meshpilot.xds.connection import Connection, WatchedResource
from meshpilot.xds.debug_access import DebugRefused
from meshpilot.xds.delta_protocol import MAX_SUBSCRIPTIONS, RefusedRequest, check_names
from meshpilot.xds.dependencies import proxy_needs_push
from meshpilot.xds.generators.base import (
    GenerationContext,
    Generator,
    KeepsUnchanged,
    Resource,
    memoized_by_identity,
)
from meshpilot.xds.generators.debug import answer_debug
from meshpilot.xds.host import StreamHost
from meshpilot.xds.stream_events import StreamEvents
from meshpilot.xds.types import PUSH_ORDER, TypeUrl, parse_type_url

log = logging.getLogger(__name__)

#: Queued like a request when the proxy's side of the stream ends: the loop stops there.
_ENDED = object()
#: Distinct unserved type URLs logged per stream; more are only counted.
_LOGGED_UNKNOWN_TYPES = 8
#: ``Stream._push_order``'s answer: each watched type with its generator, and the generator again if
#: it can tell that a push leaves its type as it was.
_Order = tuple[tuple[str, Generator, KeepsUnchanged | None], ...]
#: The types of an ``_Order`` whose generators can tell that, each with its generator.
_Keepers = tuple[tuple[str, KeepsUnchanged], ...]


class Stream(abc.ABC):
    """Serves one ADS stream for one proxy; subclasses speak one protocol."""

    #: "sotw" or "delta" (``Connection.protocol``).
    protocol: ClassVar[str]

    def __init__(
        self,
        host: StreamHost,
        context: grpc.aio.ServicerContext,
        identities: tuple[str, ...] | None = None,
    ) -> None:
        self.host = host
        self.context = context
        #: What the secure port's credential proved; None on the plaintext port (not checked).
        self.identities = identities
        #: Requests are answered before pushes (``StreamEvents``).
        self.events: StreamEvents[Any, tuple[PushRequest, Callable[[], None]]] = StreamEvents()
        self.conn: Connection | None = None
        #: Chosen once the node is known (its metadata may select other generators).
        self.generators: Mapping[TypeUrl, Generator] = {}
        self.closed = False
        self._unknown_types: set[str] = set()
        #: Warnings about what this proxy sends (NACKs, refusals) are rate-limited per stream.
        self._warnings = WarningBudget()
        #: While a push is being sent (and recorded): the responses it wrote so far.
        self._sent: list[TypeSent] | None = None
        #: ``_push_order``'s answer, and the watched types it was worked out for.
        self._order_of: tuple[str, ...] = ()
        self._order: _Order = ()
        #: ``_order``'s generators, in its order.
        self._order_generators: tuple[Generator, ...] = ()
        #: The types of ``_order`` whose generators can tell that a push keeps them, with those.
        self._keepers: _Keepers = ()

    # -- what a protocol adds ----------------------------------------------------------

    @abc.abstractmethod
    async def _first(self, requests: AsyncIterator[bytes]) -> tuple[base_pb2.Node, Any] | None:
        """The node and the first request (as ``_scan`` makes it); None if the stream ended first."""

    @abc.abstractmethod
    def _scan(self, raw: bytes) -> Any:
        """A request as the loop queues it (the reader runs this once per request)."""

    @abc.abstractmethod
    def _quiet_ack(self, incoming: Any) -> bool:
        """Record ``incoming`` if it is an ACK that needs nothing else; False for anything else."""

    @abc.abstractmethod
    async def _handle_request(self, incoming: Any) -> None: ...

    @abc.abstractmethod
    async def _send(
        self, type_url: str, request: PushRequest, names: frozenset[str] | None, *, pushed: bool
    ) -> None:
        """Generate ``type_url`` for ``request`` and write the response the protocol calls for."""

    async def _write(self, payload: bytes) -> None:
        """Write a generated response, after one turn of the loop: the other streams handed a push in
        this turn generate theirs first, and the writes then go to gRPC together instead of each
        between two proxies' generation, which the bare-gRPC floor with Python work before each write
        showed to cost gRPC more (the measurements, and how little the VirtualService push gained
        here: bench/notes.md)."""
        await asyncio.sleep(0)
        sent_at = time.monotonic()
        await self.context.write(payload)
        self.host.metrics.send_time.observe(time.monotonic() - sent_at)

    @abc.abstractmethod
    async def _write_once(
        self, type_url: TypeUrl, version: str, resources: list[Resource], control_plane: str
    ) -> None:
        """Write a response that no watch records (debug types): nothing is expected back."""

    # -- setup -------------------------------------------------------------------------

    async def run(self, requests: AsyncIterator[bytes]) -> None:
        first = await self._first(requests)
        if first is None:
            return
        node, incoming = first
        # This frame lives as long as the stream, so it lets go of the first request once it is
        # handled: a delta proxy's, when it reconnects, names every resource it holds (a thousand
        # clusters' names and versions, parsed: hundreds of KB per stream, for the stream's life).
        del first
        conn = await self._connect(node)
        del node
        self.conn = conn
        self.generators = self.host.generators_for(conn.proxy)
        self.host.add_connection(conn, self)
        reader = asyncio.create_task(self._read(requests))
        try:
            await self._handle_request(incoming)
            del incoming
            await self._loop()
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, ConnectionError) as err:
            # The client went away while we were writing; nothing to answer.
            log.debug("ADS: %s closed while sending: %s", conn.id, err)
        finally:
            self.closed = True
            reader.cancel()
            self.host.remove_connection(conn)
            self._drain_pushes()

    async def _abort(self, code: grpc.StatusCode, message: str) -> NoReturn:
        # Messages quote what the client sent; the status travels in a header gRPC caps at 8 KB.
        await self.context.abort(code, clip(message, STATUS_CHARS))
        raise AssertionError("abort returns only by raising")  # keeps type checkers informed

    def _who(self) -> str:
        return self.conn.id if self.conn is not None else self.context.peer()

    async def _refuse(self, reason: str, code: grpc.StatusCode, message: str) -> NoReturn:
        """End the stream for a request it must not serve, logged and counted by ``reason``."""
        self.host.metrics.xds_refused.labels(reason).inc()
        who = self._who()
        self._warn("ADS (%s): refused %s: %s", self.protocol, clip(who), clip(message))
        await self._abort(code, message)

    def _warn(self, message: str, *args: object) -> None:
        """Log a warning about what this proxy sent (arguments already clipped), within its budget."""
        if self._warnings.allow():
            log.warning(message + "%s", *args, self._warnings.take_suppressed())

    def _served(self, type_url: str) -> TypeUrl | None:
        """The type if this stream serves it. Otherwise None, counted and (a few per stream) logged:
        no watch is kept for it, so a client cannot grow the stream's state with made-up types, and
        it waits as it would for a resource that does not exist."""
        known = parse_type_url(type_url)
        if known is not None and known in self.generators:
            return known
        self.host.metrics.xds_refused.labels("unknown_type").inc()
        if type_url not in self._unknown_types and len(self._unknown_types) < _LOGGED_UNKNOWN_TYPES:
            self._unknown_types.add(type_url)
            who = self._who()
            log.info(
                "ADS (%s): %s asked for %s, which is not served", self.protocol, clip(who), clip(type_url)
            )
        return None

    async def _check_names(self, type_url: str, names: Sequence[str]) -> None:
        """The bounds on a request's names, both protocols: a name too long ends the stream with
        INVALID_ARGUMENT, too many names with RESOURCE_EXHAUSTED (``delta_protocol``'s limits)."""
        # Counted first: protobuf makes a string of a name only when it is read.
        if len(names) > MAX_SUBSCRIPTIONS:
            await self._refuse(
                "subscriptions",
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{len(names)} resource names for {clip(type_url)} (at most {MAX_SUBSCRIPTIONS})",
            )
        try:
            check_names(names)
        except RefusedRequest as err:
            await self._refuse("names", grpc.StatusCode.INVALID_ARGUMENT, str(err))

    def _on_nack(self, known: TypeUrl, nonce: str, error: str) -> None:
        """A NACK: counted by type and warned about (within the stream's warning budget)."""
        conn = self.conn
        assert conn is not None
        self.host.metrics.xds_rejects.labels(type=known.short).inc()
        self._warn(
            "ADS:%s: %s rejected by %s (nonce %s): %s",
            known.short.upper(),
            clip(conn.id),
            conn.peer,
            clip(nonce),
            clip(error, DETAIL_CHARS),
        )

    async def _answer(self, type_url: str, names: frozenset[str] | None) -> None:
        """Respond to a request: ``names`` of the type (None: everything watched), from the snapshot
        the stream serves (``Connection.push``)."""
        conn = self.conn
        assert conn is not None and conn.push is not None
        request = PushRequest(
            full=True, reasons=Counter({TriggerReason.PROXY: 1}), push=conn.push, token=conn.push_token
        )
        await self._send(type_url, request, names, pushed=False)

    async def _answer_debug(self, known: TypeUrl, names: Iterable[str]) -> None:
        """Answer a debug request at once. Nothing is kept (istiod keeps no watch for debug types
        either), so a push never regenerates it; a refusal ends the stream with its status."""
        conn = self.conn
        push = self.host.push_context
        assert conn is not None and push is not None
        request = PushRequest(full=True, forced=True, reasons=Counter({TriggerReason.DEBUG: 1}), push=push)
        ctx = GenerationContext(conn.proxy, push, self.host.index, request, self.host.cache, conn.identity)
        watch = WatchedResource(known.value, names=frozenset(names))
        try:
            resources = await answer_debug(self.generators[known], ctx, watch)
        except DebugRefused as err:
            await self._refuse("debug", err.code, str(err))
        except Exception:
            self.host.metrics.internal_errors.inc()
            log.exception("answering %s for %s failed", known.value, conn.id)
            return
        # Only sync status names the control plane, as istiod's does (istioctl reads it from there).
        control_plane = self.host.control_plane if known is TypeUrl.DEBUG_SYNCZ else ""
        await self._write_once(known, push.version, resources, control_plane)

    async def _connect(self, node: base_pb2.Node) -> Connection:
        if not node.id:
            await self._abort(grpc.StatusCode.INVALID_ARGUMENT, "missing node information")
        try:
            raw = json_format.MessageToDict(node.metadata) if node.HasField("metadata") else {}
            metadata = NodeMetadata.parse(raw)
            proxy = parse_proxy(
                node.id,
                metadata,
                default_cluster_id=self.host.cluster_id,
                extensions=frozenset(e.name for e in node.extensions),
                locality=locality_label(node.locality.region, node.locality.zone, node.locality.sub_zone),
                node_cluster=node.cluster,
            )
        except InvalidNode as err:
            await self._abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        verified = ""
        if self.identities is not None:
            try:
                verified = authorize(proxy, self.identities, self.host.trust_domains())
            except AuthorizationError as err:
                self.host.metrics.xds_auth_failures.labels("authorization").inc()
                log.info("ADS: refused %s: %s", clip(node.id), clip(str(err)))
                await self._abort(grpc.StatusCode.PERMISSION_DENIED, f"authorization failed: {err}")
        push = self.host.push_context
        assert push is not None, "streams are accepted only once ready"
        self.host.refresh_proxy(proxy, push)
        return Connection(
            proxy=proxy,
            peer=self.context.peer(),
            identity=verified,
            protocol=self.protocol,
            push=push,
            push_token=new_token(),
        )

    async def _read(self, requests: AsyncIterator[bytes]) -> None:
        try:
            async for raw in requests:
                self._take(raw)
                del raw  # not held while the next is awaited: why in ``_loop``
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        except Exception as err:
            # The client broke the stream off (a reset, a message over the size limit): nothing to
            # answer, and the cause is the client's, not a fault here worth a traceback.
            log.debug("ADS (%s): reading %s ended: %s", self.protocol, self._who(), clip(repr(err)))
        finally:
            self.events.put_request(_ENDED)

    def _take(self, raw: bytes) -> None:
        incoming = self._scan(raw)
        # Most requests are ACKs that change nothing; recording them here spares a trip through
        # the queue and a wake-up of the loop for every proxy of a push. Only when nothing is
        # queued: requests are handled in the order they came.
        if self.events.empty() and self._quiet_ack(incoming):
            return
        self.events.put_request(incoming)

    # -- the loop ----------------------------------------------------------------------

    def deliver(self, request: PushRequest, done: Callable[[], None]) -> None:
        """Hand a push to this stream; ``done`` is called once it was handled (or dropped)."""
        if self.closed:
            done()
            return
        self.events.put_push((request, done))

    async def _loop(self) -> None:
        while True:
            incoming, push = await self.events.get()
            if incoming is _ENDED:
                return
            if push is None:
                await self._handle_request(incoming)
            else:
                await self._handle_push(*push)
            # Not held while the next one is awaited, which may be minutes: a request may name every
            # resource the proxy holds (a state-of-the-world EDS ACK names every cluster again, a delta
            # request after a reconnect every resource with its version), and a push holds its snapshot.
            del incoming, push

    async def _handle_push(self, request: PushRequest, done: Callable[[], None]) -> None:
        try:
            await self._push(request)
        finally:
            done()

    def _drain_pushes(self) -> None:
        for _, done in self.events.take_pushes():
            done()

    # -- pushes ------------------------------------------------------------------------

    async def _push(self, request: PushRequest) -> None:
        conn = self.conn
        assert conn is not None and request.push is not None
        conn.push, conn.push_token = request.push, request.token or new_token()
        if request.full:
            self.host.refresh_proxy(conn.proxy, request.push)
        needed = proxy_needs_push(conn.proxy, request, request.push.mesh.root_namespace)
        previous = conn.proxy.previous_scope
        ordered = self._push_order(conn) if needed or previous is not None else ()
        kept: list[str] = []
        if previous is not None:
            # Only a full push has one (its refresh). It answers two questions, decided now: whether
            # the change that recomputed the state concerns a host that just left the scope, and
            # which types the change leaves as they were (``KeepsUnchanged``). istiod keeps it
            # until the next recomputation (its incremental CDS and EDS read it; nothing here
            # does): held that long, it would hold every service the proxy used to see (10,000
            # after a large file is removed) until the proxy's next full push.
            # Also for a proxy the push does not concern: what it holds stays as built for the
            # refreshed scope, so its next VirtualService push may leave it unbuilt too.
            kept = self._keep(request)
            conn.proxy.state = conn.proxy.state.settled()
        if not needed:
            return
        history = self.host.history
        sent: list[TypeSent] | None = [] if history is not None else None
        self._sent = sent
        started = time.monotonic()
        try:
            # Whether each generator's type needs the push reads only the request (``needs_push``):
            # asked once per push for the streams that watch the same, not once per stream.
            generators = self._order_generators  # set with ``ordered``
            pushing: tuple[bool, ...] = request.memoized(
                ("pushing", generators), lambda: tuple(g.needs_push(request) for g in generators)
            )
            for (type_url, generator, _), push_it in zip(ordered, pushing, strict=True):
                if not push_it:
                    continue
                if type_url in kept:
                    self.host.metrics.for_type(generator.type_url.short).unchanged_skipped.inc()
                else:
                    await self._send(type_url, request, None, pushed=True)
        finally:
            self._sent = None
            # Also when the stream broke off midway: what was written is what the proxy may have got.
            if history is not None and sent:
                duration = time.monotonic() - started
                history.proxy_pushed(
                    request.token, ProxyPush(conn.proxy.id, tuple(sent), sum(s.bytes for s in sent), duration)
                )
        self.host.metrics.convergence_time.observe(time.monotonic() - request.start)

    def _keep(self, request: PushRequest) -> list[str]:
        """The watched types that ``request`` leaves as the proxy holds them, by their generators'
        word (``KeepsUnchanged``): each was last built for the previous scope, so what it holds
        is that scope's output. Each is then held as built for the refreshed scope."""
        conn = self.conn
        assert conn is not None
        keepers = self._keepers  # set with the order (``_push_order``), which ``_push`` asks first
        if not keepers:
            return []
        proxy = conn.proxy
        state = proxy.state
        scope, previous = state.sidecar_scope, state.previous_scope
        assert scope is not None and previous is not None
        # ``kept_for`` reads no more of the proxy than the key names (``KeepsUnchanged``): asked once
        # per push for the proxies alike in it, not once per proxy.
        answers: tuple[bool, ...] = memoized_by_identity(
            request.memoized,
            ("kept", keepers, proxy.type, id(scope), id(previous), state.workload_reread),
            (scope, previous),
            lambda: self._kept_answers(keepers, request),
        )
        kept = []
        for (type_url, _), same in zip(keepers, answers, strict=True):
            if not same:
                continue
            watch = conn.watched[type_url]
            if watch.built_for == previous.serial:
                watch.built_for = scope.serial
                kept.append(type_url)
        return kept

    def _kept_answers(self, keepers: _Keepers, request: PushRequest) -> tuple[bool, ...]:
        conn = self.conn
        assert conn is not None
        answers = []
        for type_url, keeps in keepers:
            try:
                same = keeps.kept_for(conn.proxy, request)
            except Exception:
                # A fault here builds the type instead, for every proxy alike (counted and logged once).
                self.host.metrics.internal_errors.inc()
                log.exception("deciding whether %s is kept for %s and those alike failed", type_url, conn.id)
                same = False
            answers.append(same)
        return tuple(answers)

    def _record_held(self, watch: WatchedResource, digest: int | None) -> None:
        """Record what the proxy holds of ``watch``'s type after a response to it, or a push that
        found it unchanged: ``digest`` of the whole state, None after a partial response; and the
        scope it was built for (the generators read the proxy's)."""
        conn = self.conn
        assert conn is not None
        watch.digest_sent = digest
        scope = conn.proxy.sidecar_scope
        watch.built_for = scope.serial if digest is not None and scope is not None else None

    def _push_order(self, conn: Connection) -> _Order:
        """The watched types this stream generates, in push order (``PUSH_ORDER``, then the rest as
        first watched), each with its generator, again if the generator can tell that a push leaves
        its resources as they were. Worked out again only when the watched types change, not once
        per push."""
        watched = tuple(conn.watched)
        if watched != self._order_of:
            ordered: list[str] = [t for t in PUSH_ORDER if t in conn.watched]
            ordered += [t for t in watched if t not in ordered]
            pairs = []
            for type_url in ordered:
                known = parse_type_url(type_url)
                generator = self.generators.get(known) if known is not None else None
                if generator is not None:
                    keeps = generator if isinstance(generator, KeepsUnchanged) else None
                    pairs.append((type_url, generator, keeps))
            self._order_of, self._order = watched, tuple(pairs)
            self._order_generators = tuple(generator for _, generator, _ in pairs)
            self._keepers = tuple((type_url, keeps) for type_url, _, keeps in pairs if keeps is not None)
        return self._order

    def _generate(
        self, type_url: str, request: PushRequest, names: frozenset[str] | None
    ) -> tuple[TypeUrl, WatchedResource, list[Resource]] | None:
        """The resources ``request`` calls for, or None when there is nothing to send."""
        conn = self.conn
        assert conn is not None and request.push is not None
        watch = conn.watched.get(type_url)
        known = parse_type_url(type_url)
        generator = self.generators.get(known) if known is not None else None
        if watch is None or generator is None or known is None:
            return None
        ctx = GenerationContext(
            conn.proxy, request.push, self.host.index, request, self.host.cache, conn.identity
        )
        try:
            resources = generator.generate(ctx, watch, names)
        except Exception:
            self.host.metrics.internal_errors.inc()
            log.exception("generating %s for %s failed", type_url, conn.id)
            return None
        if resources is None:
            return None
        return known, watch, resources
