"""The HTTP servers: readiness and debug on the HTTP port, metrics and debug on the monitoring port.

The HTTP port is served from a thread of its own (ThreadedSite). On the main
event loop a readiness probe waits behind every callback already queued there,
and during a reconnect storm or a push to thousands of proxies that queue is
long. /ready only reads a flag, so it is answered on a separate thread with its
own event loop: it then waits for the GIL, which the main thread hands over
within the switch interval (5 ms by default), not for the push loop. The debug
pages read the push loop's state, so they are forwarded to that loop (on_loop)
and their answers carried back.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, TypeVar

from aiohttp import web
from aiohttp.typedefs import Middleware

from meshpilot.server.settings import Address

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Handler = Callable[[web.Request], Coroutine[Any, Any, web.StreamResponse]]
T = TypeVar("T")

#: The liveness probe on the HTTP port (istiod has none; docs/reliability.md shows its use).
LIVE_PATH = "/healthz/live"

#: How long ThreadedSite.stop waits for its thread to end.
_JOIN_SECONDS = 5.0


class DebugRoutes(Protocol):
    """The debug pages (``debug.DebugHandlers``; a push-worker pool's: ``pool.debug_pages``)."""

    def routes(self) -> list[web.RouteDef]: ...


def http_app(
    ready: Callable[[], bool],
    debug: DebugRoutes | None,
    forward: Callable[[Handler], Handler],
    access: Middleware | None = None,
    *,
    live: Callable[[], bool] = lambda: True,
) -> web.Application:
    """/ready, the liveness probe (``LIVE_PATH``) and the debug pages (None: not served here,
    istiod's ENABLE_DEBUG_ON_HTTP=false), ``forward`` wrapping the debug handlers (see on_loop),
    ``access`` deciding who may read them and about which namespace (``debug_access``; without it
    the debug pages refuse every caller).

    ``ready`` and ``live`` are called on the thread serving the app, so they must only read
    (``heartbeat.LoopHeartbeat`` tells them whether the main loop still moves).
    """

    async def ready_handler(request: web.Request) -> web.Response:
        if ready():
            return web.Response(text="")
        return web.Response(status=503, text="not ready\n")

    async def live_handler(request: web.Request) -> web.Response:
        if live():
            return web.Response(text="")
        return web.Response(status=503, text="event loop stalled\n")

    pages = debug.routes() if debug is not None else []
    routes = [web.route(r.method, r.path, forward(r.handler), **r.kwargs) for r in pages]  # type: ignore[arg-type]
    app = web.Application(middlewares=[access] if access is not None else [])
    app.add_routes([web.get("/ready", ready_handler), web.get(LIVE_PATH, live_handler), *routes])
    return app


def monitoring_app(
    exposition: Callable[[], Awaitable[bytes]],
    debug: DebugRoutes,
    version: str,
    access: Middleware | None = None,
) -> web.Application:
    """/metrics (``exposition``: the text of a scrape), /version and the debug pages."""

    async def metrics_handler(request: web.Request) -> web.Response:
        return web.Response(body=await exposition(), headers={"Content-Type": PROMETHEUS_CONTENT_TYPE})

    async def version_handler(request: web.Request) -> web.Response:
        return web.Response(text=version)

    app = web.Application(middlewares=[access] if access is not None else [])
    app.add_routes(
        [web.get("/metrics", metrics_handler), web.get("/version", version_handler), *debug.routes()]
    )
    return app


async def start_site(app: web.Application, address: Address) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host=address.host or None, port=address.port, reuse_address=True)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner


def on_loop(loop: asyncio.AbstractEventLoop) -> Callable[[Handler], Handler]:
    """Wrap handlers so that they run on ``loop``, whichever loop received the request.

    Only handlers that read the query, not the body, can be forwarded: the body
    stream belongs to the receiving loop.
    """

    def wrap(handler: Handler) -> Handler:
        async def forwarded(request: web.Request) -> web.StreamResponse:
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(handler(request), loop))

        return forwarded

    return wrap


class ThreadedSite:
    """An aiohttp application listening on ``address``, served by a thread and event loop of its own."""

    def __init__(self, app: web.Application, address: Address, name: str) -> None:
        self._app = app
        self._address = address
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        """Listen; what binding raises (a port in use) is raised here."""
        self._thread.start()
        self._runner = await self._on_thread(start_site(self._app, self._address))

    async def stop(self) -> None:
        if not self._thread.is_alive():
            self._loop.close()  # never started, or already stopped
            return
        try:
            if self._runner is not None:
                await self._on_thread(self._runner.cleanup())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            await asyncio.to_thread(self._thread.join, _JOIN_SECONDS)
            if not self._thread.is_alive():
                self._loop.close()

    async def _on_thread(self, work: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self._loop))
