"""A push worker process: a replica of the main process's model, serving xDS (and CreateCertificate)
on the ports it shares with the other workers."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import sys
from multiprocessing.connection import Connection
from typing import Any

from meshpilot.pool.replica import Replica
from meshpilot.pool.shared import PoolShared
from meshpilot.server import gc_tuning, logs, malloc_tuning
from meshpilot.server.app import DiscoveryApp
from meshpilot.server.heartbeat import LoopHeartbeat
from meshpilot.server.identity import IdentityPlane
from meshpilot.server.role import Role
from meshpilot.server.settings import DiscoverySettings
from meshpilot.xds.rate_limit import SharedState, TokenBucket

log = logging.getLogger(__name__)


def worker_main(
    settings: DiscoverySettings,
    index: int,
    conn: Connection,
    shared: PoolShared,
    log_options: logs.LogOptions,
) -> None:
    """The process's entry (multiprocessing's spawn start method)."""
    logs.configure(log_options)
    malloc_tuning.configure()
    gc_tuning.configure()
    # The terminal's ^C reaches every process of the group; the main process stops the workers.
    with contextlib.suppress(KeyboardInterrupt):
        try:
            asyncio.run(_serve(settings, index, conn, shared))
        except OSError as err:  # a port taken: one line, as the single process says it
            log.error("push worker %d: %s", index, err)
            sys.exit(1)


async def _serve(settings: DiscoverySettings, index: int, conn: Connection, shared: PoolShared) -> None:
    app = DiscoveryApp(settings, role=Role.WORKER)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, app.stop)
    replica = Replica(app, conn, shared.pushes_sent)
    # The server's new-stream limit, not this worker's: one bucket for the pool.
    app.server.stream_limit = TokenBucket(
        app.server.stream_limit.rate, state=SharedState(shared.stream_bucket)
    )
    replica.start(loop)
    # Read by the supervisor: a worker whose loop stops moving is killed and started again.
    heartbeat = LoopHeartbeat(stamp=functools.partial(shared.heartbeats.__setitem__, index))
    heartbeat.start()
    try:
        await run_worker(app, replica, index)
    finally:
        heartbeat.stop()


async def run_worker(app: DiscoveryApp, replica: Replica, index: int) -> None:
    """Serve once the change log reached Start; stop on ``app.stop``. The ports are bound only then,
    so that the kernel sends no connection to a worker that would refuse it."""
    settings = app.settings
    stopping = asyncio.create_task(app.stopping.wait())
    started = asyncio.create_task(replica.started.wait())
    await asyncio.wait({stopping, started}, return_when=asyncio.FIRST_COMPLETED)
    started.cancel()
    tasks: list[asyncio.Task[Any]] = []
    servers = []
    try:
        if stopping.done():
            return
        gc_tuning.freeze_loaded()
        if app.identity is not None and replica.authority is not None:
            app.identity.use(IdentityPlane.authority_from(replica.authority.files))
            await app.serve_secure(app.identity)
            tasks.append(asyncio.create_task(app.identity.run(app.stopping), name="serving certificate"))
        server = app.xds_server()
        await server.start()
        servers.append(server)
        tasks.append(asyncio.create_task(app.server.run(), name="push"))
        replica.ready()
        log.info("push worker %d serving xDS on %s", index, settings.grpc_addr)
        await stopping
    finally:
        stopping.cancel()
        if app.secure_server is not None:
            servers.append(app.secure_server)
        # Both ports drain at once: the main process allows one grace period (supervisor.stop).
        # Without a main process nothing keeps this replica current: its proxies leave at once for
        # another replica, as they would if a single process had died.
        grace = 0.0 if replica.orphaned else settings.shutdown_grace
        await asyncio.gather(*(server.stop(grace) for server in servers))
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
