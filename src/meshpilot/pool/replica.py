"""A push worker's side of the change log: applies the main process's changes, in order, to the
worker's own model, and starts the pushes the main process debounced.

While a change is applied the worker's server is muted: the registries' updates change the worker's
model (endpoints, caches) but are not debounced here, since the main process saw the same updates
and sends the push. What a worker learns by itself (a SubjectAccessReview's answer; JWKS come
from the main process) is pushed by its own debounce, under a version that extends the main process's,
and numbered after the main process's last push (``PushHistory``: ``7+1``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pickle
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from multiprocessing.connection import Connection
from multiprocessing.sharedctypes import Synchronized
from typing import TYPE_CHECKING, Any

from meshpilot.config.file_source import ObjectSink
from meshpilot.kube.multicluster import registry_sink
from meshpilot.pool import debug_pages, metrics, preview_connections
from meshpilot.pool.calls import Handlers, Pending, answer
from meshpilot.pool.change_log import encode
from meshpilot.pool.jwks import ReplicaJwks
from meshpilot.pool.ops import (
    LOCAL,
    Attach,
    Authority,
    BatchEnd,
    BatchStart,
    Call,
    Detach,
    JwksKeys,
    Mesh,
    Push,
    Ready,
    Remove,
    Reply,
    Start,
    Upsert,
)
from meshpilot.registry.kube.controller import KubeRegistry
from meshpilot.server.object_router import ObjectRouter

if TYPE_CHECKING:
    from meshpilot.server.app import DiscoveryApp

log = logging.getLogger(__name__)

#: How long a new stream waits for this worker to catch up with the pushes already sent before it
#: is served anyway (a worker far behind is stuck; its proxies are better served than refused).
CATCH_UP_WAIT = 2.0
#: At most one warning per this many seconds about streams served before catching up.
BEHIND_LOG_INTERVAL = 10.0
#: How long a question to the main process may take (it waits up to 5 s for the workers it asks).
ASK_TIMEOUT = 8.0


class Replica:
    def __init__(self, app: DiscoveryApp, conn: Connection, pushes_sent: Synchronized[int]) -> None:
        self.app = app
        self._conn = conn
        self._pushes_sent = pushes_sent
        self._send_lock = threading.Lock()
        #: Set once Start was applied: the model is loaded and the first snapshot built.
        self.started = asyncio.Event()
        #: The CA as the main process loaded it (None until it did, or with no secure ports).
        self.authority: Authority | None = None
        #: The number of the last push applied; ``_pushed`` is set (and replaced) at each.
        self.push_seq = 0
        #: The main process died: the streams end at once rather than drain (``worker_main``).
        self.orphaned = False
        self._pushed = asyncio.Event()
        #: Streams served before catching up since the last warning about them, and when that was.
        self._served_behind = 0
        self._behind_logged_at = -BEHIND_LOG_INTERVAL
        self._sinks: dict[str, ObjectSink] = {LOCAL: ObjectRouter(app.store, app.kube, app.credentials)}
        self._remote: dict[str, KubeRegistry] = {}
        #: The batches open per target, innermost last: as in the main process, one source's batch
        #: may open while another's is (a file applied in slices, a Kubernetes event between them).
        self._batches: dict[str, list[ExitStack]] = {}
        #: Questions the main process may ask (its debug pages and /metrics read the workers).
        self.handlers: Handlers = {
            **debug_pages.worker_handlers(app),
            **metrics.worker_handlers(app),
            **preview_connections.worker_handlers(app),
        }
        self._asked = Pending()
        self._tasks: set[asyncio.Task[None]] = set()
        #: The main process's JWKS: fetched there once for every worker (``pool.jwks``).
        self.jwks = ReplicaJwks(self.ask)
        app.env.jwks = self.jwks
        app.server.follower = True
        app.server.admission_gate = self.caught_up
        # istioctl reaches one worker; its debug types answer for every worker's proxies.
        app.server.generators.update(debug_pages.worker_debug_generators(app, self.ask))

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        threading.Thread(target=self._read, args=(loop,), name="change-log-reader", daemon=True).start()

    def send(self, message: object) -> None:
        data = encode(message)
        with self._send_lock, contextlib.suppress(OSError):
            self._conn.send_bytes(data)

    def _read(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            try:
                data = self._conn.recv_bytes()
            except (EOFError, OSError):
                # The main process is gone: nothing keeps this replica current any more.
                log.error("the main process closed the change log; stopping")
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self._orphaned)
                return
            try:
                loop.call_soon_threadsafe(self._received, data)
            except RuntimeError:  # the loop closed: exiting
                return

    def _orphaned(self) -> None:
        self.orphaned = True
        self.app.stop()

    def _received(self, data: bytes) -> None:
        try:
            message = pickle.loads(data)
        except Exception:
            # Only the main process writes this pipe: a message that does not load is a bug, and
            # skipping it would leave this replica behind the others. Start again from a snapshot.
            log.exception("a change log message does not load; exiting")
            self.app.stop()
            return
        if isinstance(message, Call):
            task = asyncio.create_task(self._answer(message))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        if isinstance(message, Reply):
            self._asked.resolve(message)
            return
        try:
            self.apply(message)
        except Exception:
            # The main process applied the same change without an error; a replica that differs
            # would serve other bytes. Exit: the supervisor starts a fresh one from the snapshot.
            log.exception("cannot apply %s from the change log; exiting", type(message).__name__)
            self.app.stop()

    def apply(self, op: object) -> None:
        server = self.app.server
        if isinstance(op, Push):
            if not server.start_push(op.request(), op.version, op.number or None):
                # Serving on under the old snapshot would admit streams to a state the others left.
                raise RuntimeError(f"push {op.seq} failed")
            self.push_seq = op.seq
            self._pushed.set()
            self._pushed = asyncio.Event()
        elif isinstance(op, Start):
            server.history.follow(op.number)
            with self._muted():
                server.start_serving(op.version)
            self.push_seq = max(self.push_seq, op.push_seq)
            self.started.set()
        elif isinstance(op, Authority):
            self.authority = op
        else:
            with self._muted():
                self._apply_model(op)

    def _apply_model(self, op: object) -> None:
        if isinstance(op, Upsert):
            self._sinks[op.target].upsert(op.obj)
        elif isinstance(op, Remove):
            self._sinks[op.target].remove(op.kind, op.namespace, op.name)
        elif isinstance(op, BatchStart):
            stack = ExitStack()
            stack.enter_context(self._sinks[op.target].batch())
            self._batches.setdefault(op.target, []).append(stack)
        elif isinstance(op, BatchEnd):
            self._batches[op.target].pop().close()
        elif isinstance(op, Attach):
            registry = self.app.make_registry(op.cluster)
            self._remote[op.cluster] = registry
            self._sinks[op.cluster] = registry_sink(registry)
            self.app.registry.workloads.append(registry)
        elif isinstance(op, Detach):
            registry = self._remote.pop(op.cluster)
            del self._sinks[op.cluster]
            self.app.registry.workloads.remove(registry)
        elif isinstance(op, Mesh):
            self.app.on_mesh(op.mesh)
        elif isinstance(op, JwksKeys):
            self.jwks.update(op.keys)
        else:
            raise TypeError(f"not a change log message: {op!r}")

    @contextlib.contextmanager
    def _muted(self) -> Iterator[None]:
        server = self.app.server
        server.muted = True
        try:
            yield
        finally:
            server.muted = False

    async def caught_up(self) -> None:
        """Wait (bounded) until this worker applied every push the main process had sent when the
        stream arrived: a proxy that got version N from another worker must not get N-1 here."""
        wanted = self._pushes_sent.value
        deadline = time.monotonic() + CATCH_UP_WAIT
        while self.push_seq < wanted and (left := deadline - time.monotonic()) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._pushed.wait(), left)
        if self.push_seq < wanted:
            # Its proxy may hold a newer snapshot from the worker it left, and get an older one here.
            # A reconnect storm brings thousands at once: one line per interval says how many.
            self._served_behind += 1
            now = time.monotonic()
            if now - self._behind_logged_at >= BEHIND_LOG_INTERVAL:
                log.warning(
                    "%d new stream(s) served before this worker caught up with the main process "
                    "(the last %d pushes behind, after waiting %.0f s)",
                    self._served_behind,
                    wanted - self.push_seq,
                    CATCH_UP_WAIT,
                )
                self._served_behind, self._behind_logged_at = 0, now

    def ready(self) -> None:
        self.send(Ready())

    async def _answer(self, call: Call) -> None:
        self.send(await answer(self.handlers, call))

    async def ask(self, name: str, *args: Any) -> Any:
        """Ask the main process (``PushWorkerPool.handlers``); its answer, or TimeoutError/RuntimeError."""
        return await self._asked.call(self.send, name, args, ASK_TIMEOUT)
