"""The pool of push workers: starting them, restarting one that died, stopping them all, and
whether every one of them serves."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from meshpilot.pool.calls import Handlers
from meshpilot.pool.change_log import ChangeLog
from meshpilot.pool.link import WorkerLink
from meshpilot.pool.shared import PoolShared
from meshpilot.server.heartbeat import HeartbeatOptions
from meshpilot.server.settings import DiscoverySettings
from meshpilot.xds.server import default_push_throttle

log = logging.getLogger(__name__)

#: How often the supervisor looks for workers that died.
WATCH_INTERVAL = 0.2
#: The shortest time between two starts of the same worker (a worker that dies at start must not spin).
RESTART_BACKOFF = 1.0
#: Starts in a row that exited before serving after which the pool gives up: a worker that cannot
#: bind its port or load its model will not do better the fourth time, and a server that says why
#: and exits is better than one that is never ready.
MAX_FAILED_STARTS = 3


def worker_settings(settings: DiscoverySettings, workers: int) -> DiscoverySettings:
    """A worker's settings: no sources, no webhooks; its share of a push throttle the operator set, so
    that the pool as a whole keeps that limit. Unset, each worker has the automatic value: it is a
    figure per event loop (``default_push_throttle``), and split it would shrink with the cores.
    (The new-stream rate is one bucket that every worker takes from: ``PoolShared``.)"""
    throttle = settings.push_throttle
    return dataclasses.replace(
        settings,
        config_dir=None,
        webhook_addr=None,
        push_throttle=max(1, math.ceil(throttle / workers)) if throttle else default_push_throttle(),
        push_workers=1,
    )


class PushWorkerPool:
    def __init__(
        self,
        settings: DiscoverySettings,
        changes: ChangeLog,
        registry: CollectorRegistry | None = None,
        on_failure: Callable[[], None] = lambda: None,
    ) -> None:
        """``on_failure`` is called once if a worker cannot be kept running (``failure`` says why)."""
        self.count = settings.push_workers
        self._settings = worker_settings(settings, self.count)
        self._log = changes
        self._context = multiprocessing.get_context("spawn")
        self.shared = PoolShared.create(self._context, self.count)
        self.links: list[WorkerLink | None] = [None] * self.count
        self._subscriptions: dict[int, int] = {}
        self._started_at: dict[int, float] = {}
        self._ever_ready: set[int] = set()
        self._all_ready = asyncio.Event()
        self._stopping = False
        self._failed_starts: dict[int, int] = {}
        self._on_failure = on_failure
        self._live_stall = HeartbeatOptions().live_stall
        #: Why the pool gave up on a worker, if it did.
        self.failure: str | None = None
        #: What a worker may ask the main process (``pool.calls``; the debug pages add theirs).
        self.handlers: Handlers = {}
        self.restarts = Counter(
            "meshpilot_push_worker_restarts",
            "Push workers started again after they died.",
            registry=registry,
        )

    @property
    def ready(self) -> bool:
        """Every worker has served once, and one serves now (a worker that restarts does not make
        the pool unready: its proxies reconnect to the others; none serving does)."""
        return self._all_ready.is_set() and any(link.ready for link in self.live_links())

    def start(self) -> None:
        for index in range(self.count):
            self._start(index)

    def note_push(self, seq: int) -> None:
        self.shared.pushes_sent.value = seq

    async def wait_ready(self) -> None:
        await self._all_ready.wait()

    def _start(self, index: int) -> None:
        link = WorkerLink(
            index,
            self._settings,
            self._context,
            self.shared,
            asyncio.get_running_loop(),
            self._ready,
            self.handlers,
        )
        link.start()
        self.links[index] = link
        self._started_at[index] = time.monotonic()
        # After the start: ops recorded meanwhile wait in the link's queue, in order.
        self._subscriptions[index] = self._log.subscribe(link.send)
        log.info("push worker %d started (pid %s)", index, link.pid)

    def _ready(self, link: WorkerLink) -> None:
        log.info("push worker %d serving", link.index)
        self._ever_ready.add(link.index)
        if len(self._ever_ready) == self.count:
            self._all_ready.set()

    async def watch(self) -> None:
        """Restart workers that died (or whose loop stopped moving), until cancelled."""
        while True:
            await asyncio.sleep(WATCH_INTERVAL)
            for index, link in enumerate(self.links):
                if link is not None and link.alive() and not self._stopping:
                    self._kill_if_hung(index, link)
                if link is None or link.alive() or self._stopping:
                    continue
                wait = self._started_at[index] + RESTART_BACKOFF - time.monotonic()
                if wait > 0:
                    continue
                self._log.unsubscribe(self._subscriptions.pop(index))
                link.close()
                failed = self._failed_starts[index] = (
                    0 if link.ready else self._failed_starts.get(index, 0) + 1
                )
                if failed >= MAX_FAILED_STARTS:
                    self.failure = (
                        f"push worker {index} exited {failed} times in a row before serving (last exit "
                        f"code {link.process.exitcode}); its log above says why"
                    )
                    log.error("%s", self.failure)
                    self._on_failure()
                    return
                log.warning(
                    "push worker %d (pid %s) exited with %s; starting it again",
                    index,
                    link.pid,
                    link.process.exitcode,
                )
                self.restarts.inc()
                self._start(index)

    def _kill_if_hung(self, index: int, link: WorkerLink) -> None:
        """A serving worker whose loop has not stamped its heartbeat for the liveness bound is no
        use to its proxies (they wait on a stream that never answers): killed, it is started again
        and they reconnect. The bound is the one Kubernetes' liveness probe applies to the main
        process's own loop (``server.heartbeat``)."""
        if not link.ready:
            return
        stalled = time.monotonic() - self.shared.heartbeats[index]
        if stalled > self._live_stall:
            log.error("push worker %d's loop has not moved for %.0f s; killing it", index, stalled)
            link.process.kill()

    def live_links(self) -> list[WorkerLink]:
        return [link for link in self.links if link is not None and link.alive()]

    async def call_all(self, name: str, *args: Any, timeout: float = 5.0) -> list[Any]:
        """Every serving worker's answer (a worker that does not answer is left out, and logged)."""
        return list((await self.answers(name, *args, timeout=timeout)).values())

    async def answers(self, name: str, *args: Any, timeout: float = 5.0) -> dict[int, Any]:
        """``call_all``'s answers by worker index. Only workers that serve are asked: one still
        starting holds no stream yet, and would answer only once it has imported."""
        links = [link for link in self.live_links() if link.ready]
        answers = await asyncio.gather(
            *(link.call(name, *args, timeout=timeout) for link in links), return_exceptions=True
        )
        results = {}
        for link, answer in zip(links, answers, strict=True):
            if isinstance(answer, BaseException):
                log.warning("push worker %d did not answer %s: %s", link.index, name, answer)
            else:
                results[link.index] = answer
        return results

    async def stop(self, grace: float) -> None:
        """SIGTERM to every worker (each drains its streams), then SIGKILL after ``grace`` + 2 s."""
        self._stopping = True
        links = [link for link in self.links if link is not None]
        for link in links:
            if link.alive() and link.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(link.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace + 2.0
        for link in links:
            await asyncio.to_thread(link.process.join, max(0.0, deadline - time.monotonic()))
            if link.alive():
                log.warning("push worker %d did not stop in time; killing it", link.index)
                link.process.kill()
            link.process.join(1.0)
            link.close()
