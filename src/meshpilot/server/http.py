"""The HTTP servers: readiness and debug on the HTTP port, metrics and debug on the monitoring port."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from meshpilot.server.debug import DebugHandlers
from meshpilot.server.metrics import Metrics
from meshpilot.server.settings import Address

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def http_app(ready: Callable[[], bool], debug: DebugHandlers) -> web.Application:
    async def ready_handler(request: web.Request) -> web.Response:
        if ready():
            return web.Response(text="")
        return web.Response(status=503, text="not ready\n")

    app = web.Application()
    app.add_routes([web.get("/ready", ready_handler), *debug.routes()])
    return app


def monitoring_app(metrics: Metrics, debug: DebugHandlers, version: str) -> web.Application:
    async def metrics_handler(request: web.Request) -> web.Response:
        return web.Response(body=metrics.exposition(), headers={"Content-Type": PROMETHEUS_CONTENT_TYPE})

    async def version_handler(request: web.Request) -> web.Response:
        return web.Response(text=version)

    app = web.Application()
    app.add_routes(
        [web.get("/metrics", metrics_handler), web.get("/version", version_handler), *debug.routes()]
    )
    return app


async def start_site(app: web.Application, address: Address) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host=address.host or None, port=address.port, reuse_address=True)
    await site.start()
    return runner
