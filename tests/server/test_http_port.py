"""The HTTP port's own thread: /ready answers while the main loop is busy; debug pages run on it."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from aiohttp import web
from support.processes import http_get

from bench.server import free_port
from meshpilot.server.http import ThreadedSite, on_loop
from meshpilot.server.settings import Address


def _get(port: int, path: str) -> tuple[int, str, float]:
    started = time.perf_counter()
    status, body, _ = http_get("127.0.0.1", port, path, timeout=10)
    return status, body.decode(), time.perf_counter() - started


def _app(main: asyncio.AbstractEventLoop, ready: threading.Event) -> web.Application:
    async def ready_handler(request: web.Request) -> web.Response:
        return web.Response(status=200 if ready.is_set() else 503, text=threading.current_thread().name)

    async def state(request: web.Request) -> web.Response:
        # Which thread and loop ran the handler, and its query, as the debug pages read it.
        here = asyncio.get_running_loop() is main
        return web.Response(
            text=f"{threading.current_thread().name} main-loop={here} q={request.query.get('q')}"
        )

    async def missing(request: web.Request) -> web.Response:
        raise web.HTTPNotFound(text="no such proxy")

    forward = on_loop(main)
    app = web.Application()
    app.add_routes(
        [
            web.get("/ready", ready_handler),
            web.get("/state", forward(state)),
            web.get("/missing", forward(missing)),
        ]
    )
    return app


@pytest.mark.timeout(60)
async def test_ready_answers_while_the_main_loop_is_blocked() -> None:
    main = asyncio.get_running_loop()
    ready = threading.Event()
    port = free_port()
    site = ThreadedSite(_app(main, ready), Address("127.0.0.1", port), "test-http")
    await site.start()
    try:
        with ThreadPoolExecutor(2) as pool:
            assert (await main.run_in_executor(pool, _get, port, "/ready"))[:2] == (503, "test-http")
            ready.set()
            status, body, _ = await main.run_in_executor(pool, _get, port, "/state?q=x")
            assert (status, body) == (200, "MainThread main-loop=True q=x")
            status, body, _ = await main.run_in_executor(pool, _get, port, "/missing")
            assert (status, body) == (404, "no such proxy")

            # The main loop stops answering for 1.5 s (a long push step): /ready still answers at
            # once; a debug page waits for the loop.
            probe = pool.submit(lambda: (time.sleep(0.3), _get(port, "/ready"))[1])
            page = pool.submit(lambda: (time.sleep(0.3), _get(port, "/state"))[1])
            time.sleep(1.5)  # noqa: ASYNC251 - blocking the loop is the point
            # Judged by what finished while the loop was blocked, not by how long each took (the probe
            # has 1.2 s to answer, where it needed 0.5 s before).
            assert probe.done(), "/ready answered while the main loop was blocked"
            assert not page.done(), "the debug page waited for the main loop"
            ready_status, _, _ = probe.result(timeout=10)
            assert ready_status == 200
            page_status, _, _ = await asyncio.wrap_future(page)
            assert page_status == 200
    finally:
        await site.stop()
    # Stopped: the port is free again.
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))


async def test_a_port_in_use_is_reported_by_start() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        site = ThreadedSite(web.Application(), Address("127.0.0.1", port), "test-http")
        with pytest.raises(OSError, match="in use"):
            await site.start()
        await site.stop()
        assert not any(t.name == "test-http" for t in threading.enumerate())
