"""One push worker as the main process sees it: the process, and the pipe the change log and calls
go through. The pipe is written by a thread of its own, so that a worker busy with a push never
blocks the main process's event loop (the queue in between is the part of the log it has not read
yet), and read by another, which hands what the worker says to the loop: that it serves, replies to
the main process's calls, and calls of its own (``pool.calls``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pickle
import queue
import threading
from collections.abc import Callable
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import Any

from meshpilot.pool.calls import Handlers, Pending, answer
from meshpilot.pool.change_log import encode
from meshpilot.pool.ops import Call, Ready, Reply
from meshpilot.pool.shared import PoolShared
from meshpilot.server import logs
from meshpilot.server.settings import DiscoverySettings

log = logging.getLogger(__name__)


class WorkerLink:
    def __init__(
        self,
        index: int,
        settings: DiscoverySettings,
        context: SpawnContext,
        shared: PoolShared,
        loop: asyncio.AbstractEventLoop,
        on_ready: Callable[[WorkerLink], None],
        handlers: Handlers | None = None,
    ) -> None:
        from meshpilot.pool.worker_main import worker_main

        self.index = index
        self._loop = loop
        self._on_ready = on_ready
        self._parent, child = context.Pipe()
        self.process: SpawnProcess = context.Process(
            target=worker_main,
            args=(settings, index, child, shared, logs.configured()),
            name=f"meshpilot-push-worker-{index}",
            daemon=True,
        )
        self._child = child
        self._outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._calls = Pending()
        #: What the worker may ask the main process (shared by the pool's links).
        self._handlers: Handlers = handlers if handlers is not None else {}
        self._answering: set[asyncio.Task[None]] = set()
        self.ready = False
        self._threads = [
            threading.Thread(target=self._write, name=f"push-worker-{index}-writer", daemon=True),
            threading.Thread(target=self._read, name=f"push-worker-{index}-reader", daemon=True),
        ]

    def start(self) -> None:
        self.process.start()
        self._child.close()  # the worker's end; ours would keep the pipe open after the worker died
        for thread in self._threads:
            thread.start()

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.is_alive()

    def send(self, data: bytes) -> None:
        self._outbox.put(data)

    async def call(self, name: str, *args: Any, timeout: float = 5.0) -> Any:
        """Ask the worker; its answer, or TimeoutError/RuntimeError."""
        return await self._calls.call(lambda call: self.send(encode(call)), name, args, timeout)

    def close(self) -> None:
        self._outbox.put(None)
        with contextlib.suppress(OSError):
            self._parent.close()

    def _write(self) -> None:
        while (data := self._outbox.get()) is not None:
            try:
                self._parent.send_bytes(data)
            except (OSError, ValueError):  # the worker is gone (the supervisor restarts it)
                return

    def _read(self) -> None:
        while True:
            try:
                data = self._parent.recv_bytes()
            except (EOFError, OSError):
                break
            try:
                message = pickle.loads(data)
            except Exception:
                log.exception("push worker %d sent a message that does not load", self.index)
                continue
            if not self._to_loop(self._received, message):
                return
        self._to_loop(self._gone)

    def _to_loop(self, callback: Callable[..., None], *args: Any) -> bool:
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: the main process is exiting
            return False
        return True

    def _received(self, message: object) -> None:
        if isinstance(message, Ready):
            self.ready = True
            self._on_ready(self)
        elif isinstance(message, Reply):
            self._calls.resolve(message)
        elif isinstance(message, Call):
            task = asyncio.create_task(self._answer(message))
            self._answering.add(task)
            task.add_done_callback(self._answering.discard)

    async def _answer(self, call: Call) -> None:
        self.send(encode(await answer(self._handlers, call)))

    def _gone(self) -> None:
        self._calls.fail_all(f"push worker {self.index} is gone")
