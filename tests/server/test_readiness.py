"""/ready and /healthz/live tell whether the main loop moves, though another thread answers them."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.kube import workload, write
from support.processes import http_get
from support.xds_server import settings_for, until_ready

from meshpilot.server.app import DiscoveryApp
from meshpilot.server.heartbeat import HeartbeatOptions, LoopHeartbeat
from meshpilot.server.http import LIVE_PATH
from meshpilot.server.run import run


def test_the_heartbeat_reads_stalls_against_its_bounds() -> None:
    now = [100.0]
    beat = LoopHeartbeat(HeartbeatOptions(ready_stall=5.0, live_stall=60.0), clock=lambda: now[0])
    assert beat.moving() and beat.alive()
    now[0] += 6.0
    assert not beat.moving() and beat.alive() and beat.stalled_for() == 6.0
    now[0] += 60.0
    assert not beat.alive()


@pytest.mark.timeout(60)
async def test_ready_fails_while_the_loop_is_blocked_and_recovers(tmp_path: Path) -> None:
    config = tmp_path / "config"
    write(config / "apps.yaml", workload("reviews", "default", "10.96.0.20", 9080, {"r": "127.0.0.21"}))
    app = DiscoveryApp(settings_for(config))
    app.heartbeat.options = HeartbeatOptions(interval=0.05, ready_stall=0.5, live_stall=1.0)
    task = asyncio.create_task(run(app))
    port = app.settings.http_addr.port
    try:
        await until_ready(app, task)

        def probe(path: str) -> int:
            return http_get("127.0.0.1", port, path, timeout=5)[0]

        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(2) as pool:
            assert await loop.run_in_executor(pool, probe, "/ready") == 200
            assert await loop.run_in_executor(pool, probe, LIVE_PATH) == 200

            def watch() -> list[tuple[float, int, int]]:
                # Each /ready answer with the time it came back (the server decided before that).
                seen = []
                started = time.monotonic()
                while time.monotonic() - started < 2.5:
                    ready = probe("/ready")
                    seen.append((time.monotonic(), ready, probe(LIVE_PATH)))
                    time.sleep(0.05)
                return seen

            watching = pool.submit(watch)
            # The loop's last stamp: nothing awaits from here until the freeze ends, so it beats no more.
            stamp = app.heartbeat.last
            time.sleep(1.5)  # noqa: ASYNC251 - a frozen loop is the point
            seen = await asyncio.wrap_future(watching)
        ready = [r for _, r, _ in seen]
        live = [lv for _, _, lv in seen]
        assert 503 in ready, "/ready failed while the loop was frozen"
        assert 503 in live, "the liveness probe failed once the loop was frozen past its bound"
        assert ready[-1] == 200 and live[-1] == 200, "both recovered when the loop moved again"
        # Counted from the last stamp, not from when the watcher's thread began (which a busy host
        # delays): not before the 0.5 s bound, and while the 1.5 s freeze lasted.
        first_fail = next(t for t, r, _ in seen if r == 503) - stamp
        assert 0.5 <= first_fail < 1.6, f"/ready failed {first_fail:.2f} s after the last stamp (0.5 s bound)"
    finally:
        app.stop()
        await asyncio.wait_for(task, 10)
