"""Running a discovery server that ``DiscoveryApp`` built: its ports, its tasks, until a signal.

Shutdown order: stop accepting streams and requests, end open streams within the grace period
(with a pool: the workers' too), stop the push loop, stop watching files.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import Any

from meshpilot import __version__
from meshpilot.push.preview_page import preview_route
from meshpilot.server import gc_tuning, malloc_tuning
from meshpilot.server.app import DiscoveryApp
from meshpilot.server.http import ThreadedSite, http_app, monitoring_app, on_loop, start_site
from meshpilot.server.push_status import log_push_status
from meshpilot.server.role import Role
from meshpilot.server.settings import DiscoverySettings

log = logging.getLogger(__name__)


async def run(app: DiscoveryApp) -> None:
    """Serve until ``app.stop()``; a push worker runs ``pool.worker_main`` instead."""
    assert app.role is not Role.WORKER, "a push worker runs pool.worker_main"
    settings = app.settings
    # With push workers the xDS ports are theirs: the kernel spreads new connections over them.
    server = app.xds_server() if app.pool is None else None
    runners = []
    tasks: list[asyncio.Task[Any]] = []
    # The HTTP port (/ready, debug) on its own thread: probes must not queue behind pushes.
    # The probes read the main loop's heartbeat: a frozen loop makes /ready fail (heartbeat.py).
    heartbeat = app.heartbeat
    heartbeat.start()
    http = ThreadedSite(
        http_app(
            lambda: app.ready and heartbeat.moving(),
            app.debug_pages if settings.debug_on_http else None,
            on_loop(asyncio.get_running_loop()),
            app.debug_access(),
            live=heartbeat.alive,
        ),
        settings.http_addr,
        "http",
    )
    try:
        await http.start()
        monitoring = monitoring_app(app.exposition, app.debug_pages, __version__, app.debug_access())
        # The change preview reads a request body: served on this loop only (push.preview_page).
        monitoring.add_routes([preview_route(app.preview_sources)])
        runners.append(await start_site(monitoring, settings.monitoring_addr))
        if app.webhooks is not None and not app.webhooks.serves_mesh_certificate:
            await app.webhooks.start()
        if server is not None:
            await server.start()
        if app.pool is not None:
            # Started before the sources load: the workers import meanwhile and follow the log.
            app.pool.start()
        log.info(
            "meshpilot %s serving: xDS on %s, HTTP on %s, monitoring on %s; webhooks on %s",
            __version__,
            settings.grpc_addr,
            settings.http_addr,
            settings.monitoring_addr,
            settings.webhook_addr or "(off)",
        )
        # Until the sources are loaded /ready answers 503 and new streams get UNAVAILABLE.
        if not await _load_unless_stopped(app):
            return
        tasks.append(asyncio.create_task(app.server.run(), name="push"))
        if app.pool is not None:
            tasks.append(asyncio.create_task(app.pool.watch(), name="push workers"))
        if app.identity is not None:
            tasks.append(asyncio.create_task(app.identity.run(app.stopping), name="serving certificate"))
        tasks.append(asyncio.create_task(app.jwks.run(), name="jwks"))
        tasks.append(
            asyncio.create_task(
                log_push_status(lambda: app.server.push_context, app.index), name="push status"
            )
        )
        if app.inject_source is not None:
            tasks.append(asyncio.create_task(app.inject_source.run(app.stopping), name="inject config"))
        for source in app.sources:
            tasks.append(asyncio.create_task(source.run(app.stopping), name=f"watch {source.root}"))
        await app.stopping.wait()
        log.info("shutting down")
    finally:
        if app.secure_server is not None:
            await app.secure_server.stop(settings.shutdown_grace)
        if server is not None:
            await server.stop(settings.shutdown_grace)
        if app.pool is not None:
            await app.pool.stop(settings.shutdown_grace)
        await http.stop()
        for runner in runners:
            await runner.cleanup()
        if app.webhooks is not None:
            await app.webhooks.stop()
        for component in (app.webhook_ca, app.root_certs):
            if component is not None:
                await component.stop()
        if app.kube_controller is not None:
            await app.kube_controller.stop()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for source in app.sources:
            await source.close()  # stops its loader process, also mid-file
        heartbeat.stop()


async def _load_unless_stopped(app: DiscoveryApp) -> bool:
    """Load, unless a stop comes first (an API server that never answers must not block shutdown)."""
    loading = asyncio.create_task(app.load(), name="load")
    stopping = asyncio.create_task(app.stopping.wait(), name="stop")
    await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not loading.done():
        loading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loading
        return False
    loading.result()
    return True


async def serve(settings: DiscoverySettings) -> None:
    """Run until SIGTERM or SIGINT."""
    malloc_tuning.configure()
    gc_tuning.configure()
    app = DiscoveryApp(settings, after_load=gc_tuning.freeze_loaded)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, app.stop)
    await run(app)
    if app.pool is not None and app.pool.failure is not None:
        raise OSError(app.pool.failure)
