"""A million hostile ADS requests against a server process: ``python -m bench.flood_bench``.

The flood of ``bench/ads_flood.py`` in rounds of 100,000 messages, against meshpilot serving the
three-service mesh of the fuzz tests at its default log level, with `/ready` asked every 0.25 s
meanwhile. After each round: the server's RSS (the allocator's and collector's pacing included, see
``server/malloc_tuning.py`` and ``server/gc_tuning.py``), log bytes and metric series. Written to
``bench/results/ads-flood.json``; docs/reliability.md reads it. The new-stream rate limit is lifted
(it would make this a test of the limiter), which is the flood's best case for the server: an
operator's default limit refuses most of these streams before they cost anything.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from bench.ads_flood import CLEAR, Mix, flood
from bench.server import ServerProcess

RESULTS = Path(__file__).parent / "results" / "ads-flood.json"


def _three_services() -> list[dict[str, Any]]:
    """productpage, reviews and ratings in ``default``, one endpoint each (the fuzz tests' mesh)."""
    objects: list[dict[str, Any]] = []
    apps = (("productpage", "127.0.0.11"), ("reviews", "127.0.0.21"), ("ratings", "127.0.0.31"))
    for i, (name, ip) in enumerate(apps):
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {
                    "clusterIP": f"10.96.0.{10 * (i + 1)}",
                    "selector": {"app": name},
                    "ports": [{"name": "http", "port": 9080, "targetPort": 9080}],
                },
            }
        )
        objects.append(
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": f"{name}-1",
                    "namespace": "default",
                    "labels": {"kubernetes.io/service-name": name},
                },
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 9080, "protocol": "TCP"}],
                "endpoints": [{"addresses": [ip], "conditions": {"ready": True}}],
            }
        )
    return objects


class _ReadyProbe(threading.Thread):
    def __init__(self, server: ServerProcess) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.stop = threading.Event()
        self.worst = 0.0
        self.failures = 0
        self.asked = 0

    def run(self) -> None:
        while not self.stop.wait(0.25):
            started = time.perf_counter()
            try:
                ok = self.server.get("/ready", timeout=5)[0] == 200
            except OSError:
                ok = False
            self.asked += 1
            self.failures += not ok
            self.worst = max(self.worst, time.perf_counter() - started)


def _series(server: ServerProcess) -> int:
    return len(server.metrics())


def run(rounds: int, per_round: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="meshpilot-flood-") as tmp:
        work = Path(tmp)
        config = work / "config"
        config.mkdir()
        (config / "apps.yaml").write_text(yaml.safe_dump_all(_three_services()))
        server = ServerProcess(
            config, work, extra=["--max-requests-per-second", "1000000", "--log-level", "info"]
        )
        server.start()
        try:
            time.sleep(1)
            start = {"rss_mib": server.memory()["rss_mib"], "series": _series(server)}
            probe = _ReadyProbe(server)
            probe.start()
            out: list[dict[str, Any]] = []
            ends: dict[str, int] = {}
            messages = 0
            seconds = 0.0
            for i in range(rounds):
                log_before = server.log.stat().st_size
                result = asyncio.run(flood(server.target, per_round, seed=i, mix=Mix(heavy=0.01)))
                time.sleep(3)  # the allocator's purging of freed pages, before RSS is read
                messages += result.messages
                seconds += result.seconds
                for code, n in result.ends.items():
                    ends[code] = ends.get(code, 0) + n
                out.append(
                    {
                        "messages": messages,
                        "rss_mib": round(server.memory()["rss_mib"], 1),
                        "log_bytes_per_message": round(
                            (server.log.stat().st_size - log_before) / result.messages, 1
                        ),
                        "series": _series(server),
                    }
                )
                print(json.dumps(out[-1]), flush=True)
            probe.stop.set()
            probe.join()
            metrics = server.metrics()
            return {
                "messages": messages,
                "messages_per_second": round(messages / seconds),
                "ends": ends,
                "unclear_ends": {code: n for code, n in ends.items() if code not in CLEAR},
                "internal_errors": metrics.get("pilot_total_xds_internal_errors", 0.0),
                "start": start,
                "rounds": out,
                "peak_rss_mib": round(server.memory()["peak_rss_mib"], 1),
                "ready": {"asked": probe.asked, "failed": probe.failures, "worst_s": round(probe.worst, 3)},
            }
        finally:
            server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.flood_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=100_000)
    args = parser.parse_args()
    results = run(args.rounds, args.per_round)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({k: v for k, v in results.items() if k != "rounds"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
