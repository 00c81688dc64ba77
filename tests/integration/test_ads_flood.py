"""100,000 random and hostile ADS requests over the wire, against a server process with a canary proxy.

The flood (``bench/ads_flood.py``, a process of its own) mixes both protocols and every kind of bad
request the in-process fuzz test (tests/xds/test_ads_fuzz.py) sends, the oversized ones rarely. What
must hold, as an operator's worst day would test it: every stream ends with a status the server
chose, nothing fails inside it, `/ready` keeps answering (truthfully: the loop is busy, not stuck),
the canary gets a change within a second afterwards, log bytes per message and metric series stay
bounded, and memory comes back to within 1.5 times its starting value.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from pathlib import Path

import pytest
from support.ads_client import DeltaClient
from support.kube import workload, write
from support.processes import Meshpilot, http_get
from support.reference import ROOT

from bench.ads_flood import CLEAR, NODE

pytestmark = [pytest.mark.integration]

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
REVIEWS = "outbound|9080||reviews.default.svc.cluster.local"
MESSAGES = 100_000
#: Server log bytes per request, on average over the flood, at the default level (info): a line per
#: stream opened and closed and a clipped warning for some requests.
LOG_BYTES_PER_MESSAGE = 600


def _apps(reviews: dict[str, str]) -> list[dict[str, object]]:
    return [
        *workload("productpage", "default", "10.96.0.10", 9080, {"productpage-v1": "127.0.0.11"}),
        *workload("reviews", "default", "10.96.0.20", 9080, reviews),
        *workload("ratings", "default", "10.96.0.30", 9080, {"ratings-v1": "127.0.0.31"}),
    ]


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _series(server: Meshpilot) -> int:
    status, body, _ = http_get("127.0.0.1", server.monitoring_port, "/metrics")
    assert status == 200
    return sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))


class _ReadyProbe(threading.Thread):
    """Asks /ready every 0.25 s, as a kubelet would but more often, and keeps what it saw."""

    def __init__(self, server: Meshpilot) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.stop = threading.Event()
        self.answers: list[tuple[int, float]] = []

    def run(self) -> None:
        while not self.stop.wait(0.25):
            started = time.monotonic()
            try:
                status, _, _ = http_get("127.0.0.1", self.server.http_port, "/ready")
            except OSError:
                status = 0
            self.answers.append((status, time.monotonic() - started))


async def test_a_flood_of_bad_requests_leaves_the_server_serving(tmp_path: Path) -> None:
    config = tmp_path / "config"
    write(config / "apps.yaml", _apps({"reviews-v1": "127.0.0.21"}))
    # The new-stream limit (25 a second on two cores) would make the flood a test of the limiter;
    # it has tests of its own (tests/xds/test_rate_limit.py). Logs at the server's default level.
    server = Meshpilot(
        tmp_path, config, extra=["--max-requests-per-second", "1000000", "--log-level", "info"]
    )
    server.start()
    try:
        server.wait_ready()
        canary = DeltaClient(f"127.0.0.1:{server.grpc_port}")
        canary.send(CDS, node_id=NODE)
        canary.ack(await canary.recv())
        canary.send(EDS, [REVIEWS])
        canary.ack(await canary.recv())
        await asyncio.sleep(1)
        assert server.proc is not None
        pid = server.proc.pid
        rss_before = _rss_kib(pid)
        series_before = _series(server)
        log_before = server.log_path.stat().st_size

        probe = _ReadyProbe(server)
        probe.start()
        flood = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.ads_flood",
            "--target",
            f"127.0.0.1:{server.grpc_port}",
            "--messages",
            str(MESSAGES),
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            out, _ = await asyncio.wait_for(flood.communicate(), timeout=600)
        finally:
            if flood.returncode is None:
                flood.kill()
                await flood.wait()
        assert flood.returncode == 0
        probe.stop.set()
        probe.join()
        result = json.loads(out)
        log_bytes = server.log_path.stat().st_size - log_before

        assert result["messages"] >= MESSAGES
        unclear = {code: n for code, n in result["ends"].items() if code not in CLEAR}
        assert not unclear, f"streams ended with statuses that are not a refusal: {unclear}"
        assert server.metric("pilot_total_xds_internal_errors") == 0

        not_ready = [
            (status, round(took, 3)) for status, took in probe.answers if status != 200 or took > 1.0
        ]
        assert probe.answers and not not_ready, f"/ready during the flood: {not_ready[:5]}"

        log = server.log()
        assert "Traceback" not in log
        per_message = log_bytes / result["messages"]
        assert per_message <= LOG_BYTES_PER_MESSAGE, f"{per_message:.0f} log bytes per message"
        grown = _series(server) - series_before
        assert grown <= 120, f"{grown} new metric series after the flood"

        # The canary is still served: a new reviews endpoint reaches it within a second.
        changed = time.monotonic()
        write(config / "apps.yaml", _apps({"reviews-v1": "127.0.0.21", "reviews-v2": "127.0.0.22"}))
        pushed = await canary.recv(5)
        took = time.monotonic() - changed
        assert pushed.type_url == EDS
        assert took <= 1.0, f"the canary's push came {took:.2f} s after the change"
        await canary.close()

        # What the flood's aborted streams read is freed as they end (DiscoveryServer.serve_stream),
        # and large blocks go back to the system (jemalloc's purging, or malloc_tuning on glibc).
        await asyncio.sleep(3)
        rss_after = _rss_kib(pid)
        assert rss_after <= 1.5 * rss_before, f"RSS {rss_before} KiB before the flood, {rss_after} KiB after"
        print(
            f"{result['messages']} messages over {result['streams']} streams in {result['seconds']:.1f} s: "
            f"{result['ends']}; /ready worst {max(t for _, t in probe.answers) * 1000:.0f} ms; "
            f"log {per_message:.0f} B/message; {grown} new series; RSS {rss_before} -> {rss_after} KiB; "
            f"canary push {took * 1000:.0f} ms after the change"
        )
    finally:
        server.stop()
