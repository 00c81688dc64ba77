"""A Zipkin collector for tests: Zipkin's v2 span API (``POST /api/v2/spans``) on loopback.

It keeps every span it is sent, so a test can see what a real Envoy's tracer reported. aiohttp
runs on its own thread and loop, so synchronous tests can start, read and stop it.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from aiohttp import web


class ZipkinCollector:
    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.spans: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="zipkin", daemon=True)
        self._runner: web.AppRunner | None = None

    async def _receive(self, request: web.Request) -> web.Response:
        batch = await request.json()
        if not isinstance(batch, list):
            return web.Response(status=400, text="a JSON list of spans is expected")
        with self._lock:
            self.spans.extend(span for span in batch if isinstance(span, dict))
        return web.Response(status=202)

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/api/v2/spans", self._receive)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()

    def start(self) -> ZipkinCollector:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    def received(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.spans)

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
