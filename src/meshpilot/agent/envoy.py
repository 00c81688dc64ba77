"""Envoy as the agent's child process: started with pilot-agent's arguments, restarted if it dies, drained
and stopped on shutdown.

Shutdown (pilot-agent's SIGTERM path): ask Envoy to drain (``POST /drain_listeners?inboundonly&graceful``
on its admin port; ``?graceful`` for a gateway), wait ``terminationDrainDuration`` (or until Envoy exits),
then SIGTERM, and SIGKILL after :data:`KILL_AFTER` seconds. Every wait is bounded.

Unlike pilot-agent, which exits when Envoy exits (and leaves restarting to the kubelet), this agent starts
Envoy again after a backoff, so a crashed Envoy does not take the pod's readiness down for a container
restart. The backoff doubles from :attr:`Backoff.initial` to :attr:`Backoff.maximum` and starts over once
Envoy has stayed up for :attr:`Backoff.reset_after` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

log = logging.getLogger(__name__)

#: Seconds between Envoy's SIGTERM and its SIGKILL.
KILL_AFTER = 5.0
#: Bound on one call to Envoy's admin API.
ADMIN_TIMEOUT = 2.0


@dataclass(frozen=True, slots=True)
class EnvoyOptions:
    """How to run Envoy; ``config_file`` is relative to ``cwd``, as pilot-agent passes it."""

    binary: str
    config_file: Path
    cwd: Path
    admin_port: int
    drain_duration: float = 45.0
    termination_drain_duration: float = 5.0
    concurrency: int = 0
    log_level: str = "warning"
    component_log_level: str = ""
    skip_deprecated_logs: bool = True
    ipv6: bool = False
    #: A sidecar drains only its inbound listeners; a gateway drains all.
    sidecar: bool = True
    file_flush_interval_ms: int = 1000


@dataclass(frozen=True, slots=True)
class Backoff:
    initial: float = 0.2
    maximum: float = 5.0
    reset_after: float = 10.0


def split_log_level(level: str) -> tuple[str, list[str]]:
    """``"info,misc:error"`` → (``"info"``, [``"misc:error"``]); pilot-agent's single log-level syntax."""
    base = ""
    components: list[str] = []
    for item in level.split(","):
        parts = item.split(":")
        if len(parts) == 1:
            base = parts[0]
        elif len(parts) == 2:
            components.append(item)
        else:
            log.warning("dropping invalid log level %r", item)
    return base, components


def envoy_args(options: EnvoyOptions) -> list[str]:
    """Envoy's command line, in pilot-agent's order (``pkg/envoy/proxy.go``)."""
    args = [
        options.binary,
        "-c",
        str(options.config_file),
        "--drain-time-s",
        str(int(options.drain_duration)),
        "--drain-strategy",
        "immediate",
        "--local-address-ip-version",
        "v6" if options.ipv6 else "v4",
        "--file-flush-interval-msec",
        str(options.file_flush_interval_ms),
        "--disable-hot-restart",
        "--allow-unknown-static-fields",
    ]
    level, components = split_log_level(options.log_level)
    if level:
        args += ["-l", level]
    if components:
        args += ["--component-log-level", ",".join(components)]
    elif options.component_log_level:
        args += ["--component-log-level", options.component_log_level]
    if options.skip_deprecated_logs:
        args.append("--skip-deprecated-logs")
    if options.concurrency > 0:
        args += ["--concurrency", str(options.concurrency)]
    return args


async def drain_listeners(admin_port: int, *, inbound_only: bool) -> bool:
    """Ask Envoy to drain its listeners gracefully; False (logged) when it cannot be asked."""
    query = "inboundonly&graceful" if inbound_only else "graceful"
    url = f"http://127.0.0.1:{admin_port}/drain_listeners?{query}"
    try:
        timeout = aiohttp.ClientTimeout(total=ADMIN_TIMEOUT)
        async with aiohttp.ClientSession(timeout=timeout) as session, session.post(url) as response:
            if response.status != 200:
                log.warning("Envoy's drain_listeners answered %d", response.status)
            return response.status == 200
    except (aiohttp.ClientError, TimeoutError) as err:
        log.warning("cannot ask Envoy to drain: %s", err)
        return False


class EnvoyProcess:
    """One Envoy at a time, kept running until :meth:`run`'s ``stop`` is set."""

    def __init__(
        self,
        options: EnvoyOptions,
        *,
        backoff: Backoff | None = None,
        on_start: Callable[[], None] | None = None,
    ) -> None:
        """``on_start`` is called before each start and when Envoy exits (the status server forgets the
        old Envoy's readiness)."""
        self.options = options
        self.backoff = backoff or Backoff()
        self._on_start = on_start
        #: Times Envoy was started again after it exited by itself.
        self.restarts = 0
        self._process: asyncio.subprocess.Process | None = None
        self._started = asyncio.Event()

    @property
    def pid(self) -> int | None:
        """The running Envoy's process ID, None between runs."""
        process = self._process
        return process.pid if process is not None and process.returncode is None else None

    async def wait_started(self) -> None:
        await self._started.wait()

    async def _start(self) -> asyncio.subprocess.Process:
        args = envoy_args(self.options)
        log.info("starting Envoy: %s", " ".join(args))
        if self._on_start is not None:
            self._on_start()
        process = await asyncio.create_subprocess_exec(
            *args, cwd=self.options.cwd, stdin=asyncio.subprocess.DEVNULL
        )
        self._process = process
        self._started.set()
        return process

    async def run(self, stop: asyncio.Event) -> None:
        """Run Envoy until ``stop`` is set, restarting it when it exits; then drain and stop it."""
        try:
            await self._run(stop)
        finally:
            # Cancelled or failed: Envoy must not outlive the agent.
            await self.kill()

    async def _run(self, stop: asyncio.Event) -> None:
        delay = self.backoff.initial
        while not stop.is_set():
            started = time.monotonic()
            process = await self._start()
            exited = asyncio.create_task(process.wait())
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait({exited, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if not exited.done():
                exited.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await exited
                await self.shutdown()
                return
            log.warning("Envoy exited with %s; starting it again in %.1fs", process.returncode, delay)
            # Not ready while there is no Envoy: forget its readiness now, not at the next start.
            if self._on_start is not None:
                self._on_start()
            if time.monotonic() - started >= self.backoff.reset_after:
                delay = self.backoff.initial
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            delay = min(delay * 2, self.backoff.maximum)
            if not stop.is_set():
                self.restarts += 1

    async def shutdown(self) -> None:
        """Drain, wait terminationDrainDuration (less if Envoy exits), then stop Envoy; idempotent."""
        process = self._process
        if process is None or process.returncode is not None:
            return
        log.info("draining Envoy for %.1fs", self.options.termination_drain_duration)
        await drain_listeners(self.options.admin_port, inbound_only=self.options.sidecar)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), self.options.termination_drain_duration)
        await self.kill()

    async def kill(self) -> None:
        """SIGTERM, then SIGKILL after :data:`KILL_AFTER`; returns once Envoy is gone."""
        process = self._process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), KILL_AFTER)
        except TimeoutError:
            log.warning("Envoy did not stop in %.0fs; killing it", KILL_AFTER)
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        log.info("Envoy stopped (%s)", process.returncode)
