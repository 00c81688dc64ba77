"""The reconnect storm: a whole fleet dropped and reconnecting at once, with /ready sampled throughout."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.fleet import Fleet
from bench.measure import DEBOUNCE, fleet_specs, summary
from bench.scenario import Scenario
from bench.server import ServerProcess


@dataclass(frozen=True)
class StormJob:
    scenario: Scenario
    #: Sample /ready this often while the fleet reconnects.
    ready_interval: float = 0.05
    timeout: float = 900.0


class ReadyProbe(threading.Thread):
    """Polls /ready and records how long each answer took (None: no answer within 5 s)."""

    def __init__(self, server: ServerProcess, interval: float) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.interval = interval
        self.samples: list[tuple[float, float | None, int]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            started = time.perf_counter()
            try:
                status, _ = self.server.get("/ready", timeout=5)
                self.samples.append((time.time(), time.perf_counter() - started, status))
            except OSError:
                self.samples.append((time.time(), None, 0))
            self.stopping.wait(self.interval)


def _reconnect(
    server: ServerProcess, fleet: Fleet, job: StormJob, reconnect: Callable[[], None]
) -> dict[str, Any]:
    """Make every stream reconnect; time until all are synced again on new streams, probing /ready."""
    before = fleet.status()
    metrics_before = server.metrics()
    pid = server.proc.pid if server.proc is not None else None
    started = time.time()
    reconnect()
    if server.proc is None or server.proc.pid != pid:
        metrics_before = {}  # a new process counts from zero
    probe = ReadyProbe(server, job.ready_interval)
    probe.start()
    cpu = server.cpu_seconds()
    try:
        resync = fleet.wait_synced(job.timeout, since=started)
    finally:
        probe.stopping.set()
        probe.join(10)
    after = fleet.status()
    latencies = [s[1] for s in probe.samples if s[1] is not None and s[2] == 200]
    limited = "meshpilot_xds_rate_limited"
    metrics = server.metrics()
    return {
        "resync_seconds": round(resync, 3),
        "server_cpu_seconds": round(server.cpu_seconds() - cpu, 3),
        "stream_attempts": after["connects"] - before["connects"],
        "streams_ended": {
            code: n - before.get("ended", {}).get(code, 0) for code, n in after.get("ended", {}).items()
        },
        "rate_limited": metrics.get(limited, 0.0) - metrics_before.get(limited, 0.0),
        "empty_configs": after["empty_configs"] - before["empty_configs"],
        "stream_end_samples": after["samples"],
        "ready_probes": len(probe.samples),
        "ready_failures": sum(1 for s in probe.samples if s[1] is None or s[2] != 200),
        "ready_latency_seconds": summary(latencies),
        "ready_over_100ms": sum(1 for v in latencies if v > 0.1),
        # When the slowest answers came (seconds after the reconnect began), to set beside the logs.
        "ready_slowest": [
            [round(at - started, 2), None if took is None else round(took, 4)]
            for at, took, _ in sorted(probe.samples, key=lambda s: -(s[1] or 5.0))[:5]
        ],
    }


def run_storm(job: StormJob, workdir: Path) -> dict[str, Any]:
    """Every stream reconnects at once, at istiod's default stream rate: streams dropped, then a restart."""
    scenario = job.scenario
    config = workdir / "config"
    scenario.write(config)
    server = ServerProcess(config, workdir, extra=["--debounce-after", DEBOUNCE])
    result: dict[str, Any] = {"scenario": scenario.name, "proxies": scenario.proxies}
    fleet: Fleet | None = None
    try:
        server.start()
        fleet = Fleet(
            server.target, fleet_specs(scenario), scenario.route_names(), workers=2, own_connections=True
        )
        fleet.start()
        result["initial_sync_seconds"] = round(fleet.wait_synced(job.timeout), 3)
        # The streams drop at once (a load balancer reset) and come back to a running server.
        result["streams_dropped"] = _reconnect(server, fleet, job, fleet.restart)

        # The server restarts (a rollout); proxies retry while it loads and must get no empty config.
        def restart() -> None:
            server.restart()

        result["server_restarted"] = _reconnect(server, fleet, job, restart)
        result["peak_rss_mib"] = round(server.memory()["peak_rss_mib"], 1)
    finally:
        if fleet is not None:
            fleet.stop()
        server.stop()
    return result


# -- micro benchmarks ------------------------------------------------------------------
