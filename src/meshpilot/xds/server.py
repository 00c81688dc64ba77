"""The discovery server: ADS over gRPC, debounced pushes, and the XdsUpdater registries call.

Data flows one way: registries and stores call the XdsUpdater methods; those
become PushRequests; debounce merges them; a push builds a new PushContext
(full pushes) and queues every connection; push workers hand each queued
connection its merged request; the connection's stream generates and sends.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import grpc

from meshpilot.bounded_logs import clip
from meshpilot.ca.authenticate import Authenticator, authenticate
from meshpilot.metric_labels import ProxyVersions
from meshpilot.model.config import ConfigKey
from meshpilot.model.endpoint import Endpoint
from meshpilot.model.endpoint_index import EndpointIndex, PushType, ShardKey
from meshpilot.model.kind import Kind
from meshpilot.model.proxy import Proxy
from meshpilot.model.push_context import PushContext
from meshpilot.model.push_request import PushRequest, TriggerReason, registry_request
from meshpilot.push.debounce import Debounced, DebounceOptions, debounce
from meshpilot.push.environment import push_version
from meshpilot.push.history import PushHistory
from meshpilot.push.push_log import go_duration, log_debounced
from meshpilot.push.queue import PushQueue
from meshpilot.push.throttle import PushSlots
from meshpilot.server.aborts import clear_abort_frames
from meshpilot.server.metrics import Metrics
from meshpilot.xds.cache import DEFAULT_SIZE, XdsCache, assertions_enabled, new_token
from meshpilot.xds.connection import Connection
from meshpilot.xds.delta_stream import DeltaStream
from meshpilot.xds.generators import Generator, generators_by_metadata, sidecar_generators
from meshpilot.xds.host import PushTarget
from meshpilot.xds.rate_limit import TokenBucket, default_rate
from meshpilot.xds.sotw_stream import SotwStream
from meshpilot.xds.stream import Stream
from meshpilot.xds.types import TypeUrl

log = logging.getLogger(__name__)

ADS_SERVICE = "envoy.service.discovery.v3.AggregatedDiscoveryService"
NOT_READY = "server is not ready to serve discovery information"


class Environment(Protocol):
    """What the server reads; implemented by push.environment.MeshEnvironment."""

    index: EndpointIndex

    def build_push_context(self, version: str) -> PushContext: ...

    def refresh_proxy(self, proxy: Proxy, push: PushContext) -> None: ...


def default_push_throttle() -> int:
    """The limit on one process's concurrent pushes (each push worker's of a pool) when none is set:
    100, the most that istiod's automatic value, min(15 + 5 per CPU, 100), reaches. istiod scales it
    with the CPUs because its pushes run on all of them at once. A meshpilot process runs its pushes
    on one event loop, where a slot buys no CPU, and few slots leave the loop waiting for write
    completions between pushes: on 2 CPUs, a VirtualService push to 2,000 proxies cost about 13% less
    server CPU with 100 than with istiod's 25, the endpoint push the same (bench/notes.md)."""
    return 100


@dataclass(frozen=True, slots=True)
class DiscoveryOptions:
    debounce: DebounceOptions = field(default_factory=DebounceOptions)
    push_throttle: int = 0
    cluster_id: str = "Kubernetes"
    #: Entries per cached type (PILOT_XDS_CACHE_SIZE); 0 disables the cache (PILOT_ENABLE_XDS_CACHE=false).
    cache_size: int = DEFAULT_SIZE
    #: New streams per second (PILOT_MAX_REQUESTS_PER_SECOND); 0 is istiod's automatic value.
    max_requests_per_second: float = 0.0
    #: How long a new stream may wait for its turn before RESOURCE_EXHAUSTED.
    request_wait: float = 1.0
    #: How sync status responses name this server (``StreamHost.control_plane``); "" names none.
    control_plane: str = ""


class DiscoveryServer:
    def __init__(
        self,
        env: Environment,
        metrics: Metrics,
        options: DiscoveryOptions | None = None,
        generators: dict[TypeUrl, Generator] | None = None,
        metadata_generators: dict[str, dict[TypeUrl, Generator]] | None = None,
    ) -> None:
        self.env = env
        self.metrics = metrics
        self.options = options or DiscoveryOptions()
        self.generators = generators if generators is not None else sidecar_generators()
        #: By node metadata GENERATOR; these win over ``generators`` for the types they hold.
        self.metadata_generators = (
            metadata_generators if metadata_generators is not None else generators_by_metadata()
        )
        self.push_context: PushContext | None = None
        self.cache = (
            XdsCache(self.options.cache_size, metrics, verify=assertions_enabled())
            if self.options.cache_size > 0
            else None
        )
        self.stream_limit = TokenBucket(self.options.max_requests_per_second or default_rate())
        self.connections: dict[str, Connection] = {}
        #: pilot_xds{version} labels (bounded: ISTIO_VERSION is the client's to choose), by connection.
        self._versions_seen = ProxyVersions()
        self._version_labels: dict[str, str] = {}
        self._streams: dict[str, PushTarget] = {}
        self._events: asyncio.Queue[PushRequest] = asyncio.Queue()
        self._queue: PushQueue[str] = PushQueue()
        self._versions = itertools.count(1)
        self._tasks: list[asyncio.Task[None]] = []
        self._listeners: list[Callable[[PushRequest], None]] = []
        #: The recent pushes, for the debug pages and ``meshpilot explain``.
        self.history = PushHistory()
        #: Events the debounce merged into the push about to start (push() reads it once).
        self._merged = 1
        #: Who may connect on the secure port; plaintext streams are anonymous.
        self.authenticators: Sequence[Authenticator] = ()
        #: The trust domains whose identities may ask for config on the secure port (MeshConfig's
        #: trustDomain and aliases, read per stream: the mesh may change).
        self.trust_domains: Callable[[], Collection[str]] = lambda: ("cluster.local",)
        #: In a push worker: while the main process's changes are applied, the model's updates are
        #: not debounced here (the main process debounces them and sends the push; ``pool.replica``).
        self.muted = False
        #: In a push worker: waited on before a new stream is served, so that a proxy that moves to
        #: this worker never gets an older state than the one it left (``pool.replica``).
        self.admission_gate: Callable[[], Awaitable[None]] | None = None
        #: A push worker: full pushes of its own (a JWKS fetched here) extend the version of the main
        #: process's last one instead of counting on their own.
        self.follower = False
        self._local_pushes = itertools.count(1)

    # -- what streams read (xds.host.StreamHost) ---------------------------------------

    @property
    def cluster_id(self) -> str:
        return self.options.cluster_id

    @property
    def index(self) -> EndpointIndex:
        return self.env.index

    @property
    def control_plane(self) -> str:
        return self.options.control_plane

    def refresh_proxy(self, proxy: Proxy, push: PushContext) -> None:
        self.env.refresh_proxy(proxy, push)

    def generators_for(self, proxy: Proxy) -> Mapping[TypeUrl, Generator]:
        """The generators serving ``proxy``: its GENERATOR's first, then the defaults (istiod's order)."""
        chosen = self.metadata_generators.get(proxy.metadata.generator)
        return self.generators if not chosen else {**self.generators, **chosen}

    # -- readiness ---------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self.push_context is not None

    def start_serving(self, version: str | None = None) -> None:
        """Build the first snapshot; streams are accepted from now on. ``version``: the snapshot's
        version when another process chose it (a push worker starts at the main process's).

        Changes reported while the sources loaded are all in this snapshot, so
        they are dropped instead of causing a push nobody needs.
        """
        while not self._events.empty():
            self._events.get_nowait()
        self._rebuild_push_context(version)

    def _queue_event(self, request: PushRequest) -> None:
        if not self.muted:
            self._events.put_nowait(request)

    # -- XdsUpdater -------------------------------------------------------------

    def config_update(self, request: PushRequest) -> None:
        if self.muted:
            return
        for reason in request.reasons:
            if reason is TriggerReason.CONFIG:
                self.metrics.inbound_updates.labels(type="config").inc()
        self._events.put_nowait(request)

    def eds_update(
        self, shard: ShardKey, hostname: str, namespace: str, endpoints: Sequence[Endpoint]
    ) -> None:
        if not self.muted:
            self.metrics.inbound_updates.labels(type="eds").inc()
        push_type = self.env.index.update_service_endpoints(shard, hostname, namespace, endpoints)
        if push_type is PushType.NO_PUSH:
            return
        key = ConfigKey(Kind.SERVICE_ENTRY, hostname, namespace)
        self.history.note_change(key, "endpoints")
        if self.cache is not None:
            # Now, not at push time: a proxy asking meanwhile must not get the old endpoints.
            self.cache.clear({key})
        full = push_type is PushType.FULL
        self._queue_event(registry_request(key, TriggerReason.ENDPOINT, full=full))

    def service_update(self, shard: ShardKey, hostname: str, namespace: str, deleted: bool) -> None:
        if not self.muted:
            self.metrics.inbound_updates.labels(type="svcdelete" if deleted else "svc").inc()
        if deleted:
            self.env.index.delete_service_shard(shard, hostname, namespace)
        key = ConfigKey(Kind.SERVICE_ENTRY, hostname, namespace)
        self.history.note_change(key, "delete" if deleted else "update")
        if self.cache is not None:
            self.cache.clear({key})
        self._queue_event(registry_request(key, TriggerReason.SERVICE))

    def proxy_update(self, cluster_id: str, ip: str) -> None:
        push = self.push_context
        if push is None:
            return
        for conn in self.connections.values():
            if conn.proxy.cluster_id == cluster_id and ip in conn.proxy.ip_addresses:
                request = PushRequest(
                    full=True, forced=True, reasons=Counter({TriggerReason.PROXY: 1}), push=push
                )
                self._queue.enqueue(conn.id, request)

    # -- pushing -----------------------------------------------------------------

    def add_push_listener(self, listener: Callable[[PushRequest], None]) -> None:
        """Observe every push as it starts (for the debug endpoints and tests)."""
        self._listeners.append(listener)

    def _next_version(self) -> str:
        if not self.follower or self.push_context is None:
            return push_version(next(self._versions))
        # A push worker's own full push (not one the main process sent): after the main's version.
        return f"{self.push_context.version.partition('+')[0]}+{next(self._local_pushes)}"

    def _rebuild_push_context(self, version: str | None = None) -> PushContext:
        started = time.monotonic()
        push = self.env.build_push_context(version or self._next_version())
        took = time.monotonic() - started
        self.metrics.pushcontext_init.observe(took)
        log.debug("InitContext %s for push took %s", push.version, go_duration(took))
        self.metrics.services.set(len(push.services))
        self.metrics.virtual_services.set(len(push.virtual_services))
        self.push_context = push
        return push

    async def push(self, request: PushRequest) -> None:
        """Push a debounced request to every connection."""
        self.start_push(request)

    def start_push(self, request: PushRequest, version: str | None = None, number: int | None = None) -> bool:
        """Build the snapshot a push needs and queue every connection; ``version`` names a full
        push's snapshot and ``number`` its record (``history``) when another process chose them
        (the main process of a push-worker pool). False if it failed (logged and counted)."""
        try:
            if request.full or self.push_context is None:
                push = self._rebuild_push_context(version)
                if self.cache is not None:
                    if request.is_everything:
                        self.cache.clear_all()
                    else:
                        self.cache.clear(request.configs_updated)
            else:
                push = self.push_context
            request.push = push
            request.token = new_token()
            merged, self._merged = self._merged, 1
            # A push worker's own push (a SubjectAccessReview's answer) is numbered apart from the
            # main process's pushes, which carry their numbers (``number``).
            request.number = self.history.started(
                request, merged, number, local=self.follower and number is None
            )
            log.info(
                "XDS: Pushing Services:%d ConnectedEndpoints:%d Version:%s",
                len(push.services),
                len(self.connections),
                push.version,
            )
            for reason, count in request.reasons.items():
                self.metrics.push_triggers.labels(type=reason.value).inc(count)
            for listener in self._listeners:
                listener(request)
            for conn_id in list(self.connections):
                self._queue.enqueue(conn_id, request)
        except Exception:
            self.metrics.internal_errors.inc()
            log.exception("push failed")
            return False
        return True

    async def _push_worker(self, slots: PushSlots) -> None:
        while True:
            if slots.full:
                await slots.wait()
            item = await self._queue.dequeue()
            if item is None:
                return
            conn_id, request = item
            stream = self._streams.get(conn_id)
            if stream is None:
                self._push_done(conn_id)
                continue
            self.metrics.queue_time.observe(max(0.0, time.monotonic() - request.start))
            slots.take()

            def done(conn_id: str = conn_id) -> None:
                self._push_done(conn_id)
                slots.give_back()

            stream.deliver(request, done)

    def _push_done(self, conn_id: str) -> None:
        self._queue.mark_done(conn_id)
        if self._queue.idle and self.push_context is not None:
            # Nothing is queued or being pushed: the proxies pushed with this snapshot have taken
            # over what they need of the one before's carried outputs, and the rest may go.
            self.push_context.release_carried()

    async def run(self) -> None:
        """Debounce and push until cancelled."""
        slots = PushSlots(self.options.push_throttle or default_push_throttle())

        def observe(request: PushRequest, how: Debounced) -> None:
            self.metrics.debounce_time.observe(how.since_first)
            self._merged = how.events
            log_debounced(request, how, self.history.next_label(local=self.follower))

        tasks = [
            asyncio.create_task(
                debounce(self._events, self.push, self.options.debounce, on_debounced=observe)
            )
        ]
        tasks.append(asyncio.create_task(self._push_worker(slots)))
        self._tasks = tasks
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            self._queue.close()

    # -- connections -------------------------------------------------------------

    def add_connection(self, conn: Connection, stream: PushTarget) -> None:
        self.connections[conn.id] = conn
        self._streams[conn.id] = stream
        label = self._version_labels[conn.id] = self._versions_seen.acquire(conn.proxy.metadata.istio_version)
        self.metrics.xds_clients.labels(version=label).inc()
        self.history.connected(conn.proxy.id)
        log.info("ADS: new connection for node:%s (%s)", clip(conn.id), conn.peer)

    def remove_connection(self, conn: Connection) -> None:
        if self.connections.pop(conn.id, None) is None:
            return
        self._streams.pop(conn.id, None)
        self._queue.remove(conn.id)
        self.history.disconnected(conn.proxy.id)
        label = self._version_labels.pop(conn.id)
        self.metrics.xds_clients.labels(version=label).dec()
        if self._versions_seen.release(label):
            self.metrics.xds_clients.remove(label)
        log.info("ADS: %s terminated", clip(conn.id))

    def push_all(self, reason: TriggerReason = TriggerReason.DEBUG) -> None:
        """Queue a forced full push to every proxy (``/debug/adsz?push=true``)."""
        self._events.put_nowait(PushRequest(full=True, forced=True, reasons=Counter({reason: 1})))

    # -- gRPC --------------------------------------------------------------------

    async def _admit(self, context: grpc.aio.ServicerContext, *, secure: bool) -> tuple[str, ...] | None:
        """Whether a new stream may be served now, and who its credential proved it is (the secure
        port; None on the plaintext one). Aborts the stream when it may not."""
        if not self.ready:
            await context.abort(grpc.StatusCode.UNAVAILABLE, NOT_READY)
        if self.admission_gate is not None:
            await self.admission_gate()
        if not await self.stream_limit.acquire(self.options.request_wait):
            self.metrics.rate_limited.inc()
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "request rate limit exceeded")
        if not secure:
            return None
        metadata = tuple(context.invocation_metadata() or ())
        caller = await authenticate(self.authenticators, context.auth_context(), metadata)
        if caller is None:
            self.metrics.xds_auth_failures.labels("authentication").inc()
            log.info("ADS: refused %s: no credential proved an identity", context.peer())
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "authentication failure")
            raise AssertionError("abort returns only by raising")
        return caller.identities

    async def serve_stream(
        self,
        kind: type[Stream],
        requests: AsyncIterator[bytes],
        context: grpc.aio.ServicerContext,
        *,
        secure: bool = False,
    ) -> None:
        """Serve one ADS stream of either protocol (``SotwStream`` or ``DeltaStream``)."""
        try:
            identities = await self._admit(context, secure=secure)
            # Not named here: this frame stays in an abort's traceback, and so would the stream.
            await kind(self, context, identities).run(requests)
        except grpc.aio.AbortError as err:
            await _let_go(err, requests)
            raise

    def grpc_handler(self, *, secure: bool = False) -> grpc.GenericRpcHandler:
        """ADS handlers; responses are written already serialized. ``secure``: the handler of the secure
        port, whose every stream must authenticate (the port decides, not the connection)."""

        def identity(payload: bytes) -> bytes:
            return payload

        async def sotw(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
            await self.serve_stream(SotwStream, requests, context, secure=secure)

        async def delta(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
            await self.serve_stream(DeltaStream, requests, context, secure=secure)

        handlers = {
            # Requests arrive as bytes: most are ACKs the stream records without a parse.
            "StreamAggregatedResources": grpc.stream_stream_rpc_method_handler(
                sotw,
                request_deserializer=identity,
                response_serializer=identity,
            ),
            # Parsed by the stream, so that a malformed one ends it with INVALID_ARGUMENT.
            "DeltaAggregatedResources": grpc.stream_stream_rpc_method_handler(
                delta,
                request_deserializer=identity,
                response_serializer=identity,
            ),
        }
        return grpc.method_handlers_generic_handler(ADS_SERVICE, handlers)


async def _let_go(err: BaseException, requests: AsyncIterator[bytes]) -> None:
    """Free what an aborted stream read: its frames (``server.aborts``) and the request receiver,
    which holds its last message until closed; while the stream's reader task is inside it, the
    task's cancellation closes it. What stays is grpc's own part, small enough to wait for CPython's
    own full collections: a flood of 100,000 hostile requests over 8,000 streams leaves the server's
    memory as it does with a full collection after every thousand of them (docs/reliability.md)."""
    clear_abort_frames(err)
    close = getattr(aiter(requests), "aclose", None)
    if close is None:
        return
    try:
        await close()
    except RuntimeError:  # "already running": the reader is inside it, and its cancellation closes it
        pass
    except Exception:  # the abort's own status matters more than this cleanup
        log.exception("ADS: could not close the requests of an aborted stream")
