"""``/debug/ui`` in a real headless Chromium, against a meshpilot process with a few connected proxies.

The page's numbers are read from the DOM Chromium built (``--dump-dom``) and checked against what
``/debug/syncz`` reports and what the clients received; a screenshot is kept as a test artifact.
With two push workers, the proxies are spread over both (a stream is opened again until it lands on
the other worker), so the page must gather both workers' streams and add up what each sent.
"""

from __future__ import annotations

import asyncio
import shutil
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from envoy.service.discovery.v3 import discovery_pb2
from support.ads_client import AdsClient, DeltaClient
from support.kube import istio, workload, write
from support.pool_sockets import ServerSockets
from support.processes import Meshpilot
from support.wait import eventually

pytestmark = [pytest.mark.integration]

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
LDS = "type.googleapis.com/envoy.config.listener.v3.Listener"
ARTIFACTS = Path(__file__).resolve().parents[2] / "build" / "test-artifacts"


def _node(pod: str, ip: str) -> str:
    return f"sidecar~{ip}~{pod}.default~default.svc.cluster.local"


class _Page(HTMLParser):
    """The rows of the page's tables, by their ``data-`` attributes and cell texts."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict[str, Any]] = []
        self.fields: dict[str, str] = {}
        self._row: dict[str, Any] | None = None
        self._cell: dict[str, str] | None = None
        self._field: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "tr" and a.get("class") in ("proxy", "push", "slow"):
            self._row = {"class": a["class"], "attrs": a, "cells": [], "types": {}, "fields": {}}
            self.rows.append(self._row)
        elif tag == "td" and self._row is not None:
            self._cell = a
            self._row["cells"].append("")
        elif "data-field" in a and self._row is None:
            self._field = a["data-field"]
            self.fields[self._field] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr":
            self._row = None
        elif tag == "td" and self._row is not None and self._cell is not None:
            text = self._row["cells"][-1]
            if "data-type" in self._cell:
                self._row["types"][self._cell["data-type"]] = text
            if "data-field" in self._cell:
                self._row["fields"][self._cell["data-field"]] = self._cell.get("data-value", text)
            self._cell = None
        elif self._field is not None:
            self._field = None

    def handle_data(self, data: str) -> None:
        if self._row is not None and self._cell is not None:
            self._row["cells"][-1] += data
        elif self._field is not None:
            self.fields[self._field] += data


def _expected_status(entry: dict[str, Any], prefix: str) -> str:
    """istioctl's rule, from what /debug/syncz shows: the nonces sent and acknowledged."""
    sent, acked = entry.get(f"{prefix}_sent", ""), entry.get(f"{prefix}_acked", "")
    if not sent and not acked:
        return "IGNORED"
    return "SYNCED" if sent == acked else ("NOT SENT" if not sent else "STALE")


async def _chromium(*args: str) -> bytes:
    binary = shutil.which("chromium")
    assert binary is not None, "Debian's chromium package is needed (make's system deps install it)"
    proc = await asyncio.create_subprocess_exec(
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--window-size=1400,1000",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    return out


async def _open(
    mp: Meshpilot, delta: bool, node_id: str, holders: set[int], *, spread: bool = False
) -> tuple[AdsClient | DeltaClient, Any]:
    """A stream that sent its first CDS request, and the answer; the process that took it joins
    ``holders``. ``spread``: on a process not yet in ``holders`` (the kernel picks a worker per
    connection, so the stream is opened again until it lands there)."""
    target = f"127.0.0.1:{mp.grpc_port}"
    for _ in range(30):
        before = ServerSockets.read(mp.proc.pid, mp.grpc_port)
        client: AdsClient | DeltaClient = (
            DeltaClient(target, own_connection=True) if delta else AdsClient(target, own_connection=True)
        )
        client.send(CDS, node_id=node_id)
        first = await client.recv(10)
        taker = ServerSockets.read(mp.proc.pid, mp.grpc_port).taken_since(before)
        if not spread or not taker <= holders:
            holders |= taker
            return client, first
        await client.close()
    raise AssertionError(f"every connection landed on {holders}")


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "two-push-workers"])
async def test_debug_ui_in_headless_chromium(tmp_path: Path, workers: int) -> None:
    config = tmp_path / "config"
    write(
        config / "apps.yaml",
        [
            *workload("productpage", "default", "10.96.0.10", 9080, {"productpage-v1": "127.0.0.11"}),
            *workload("reviews", "default", "10.96.0.20", 9080, {"reviews-v1": "127.0.0.21"}),
            *workload("ratings", "default", "10.96.0.30", 9080, {"ratings-v1": "127.0.0.31"}),
        ],
    )
    mp = Meshpilot(tmp_path, config, extra=["--log-level", "info", "--push-workers", str(workers)])
    mp.start()
    clients: list[AdsClient | DeltaClient] = []
    # The workers that hold a stream so far (the second stream avoids the first's).
    holders: set[int] = set()
    try:
        mp.wait_ready()
        # Two state-of-the-world proxies that acknowledge what they get...
        received: dict[str, list[discovery_pb2.DiscoveryResponse]] = {}
        for pod, ip in (("productpage-v1", "127.0.0.11"), ("reviews-v1", "127.0.0.21")):
            client, first = await _open(mp, False, _node(pod, ip), holders, spread=workers > 1)
            assert isinstance(client, AdsClient)
            clients.append(client)
            client.ack(first)
            client.send(LDS)
            client.ack(await client.recv(10))
            received[f"{pod}.default"] = []
        assert len(holders) == min(workers, 2), holders
        # ... and a delta one that never acknowledges its listeners: STALE.
        delta, cds = await _open(mp, True, _node("ratings-v1", "127.0.0.31"), holders)
        assert isinstance(delta, DeltaClient)
        clients.append(delta)
        delta.send(CDS, nonce=cds.nonce)
        delta.send(LDS)
        await delta.recv(10)

        # A change every proxy gets: the push the page must show.
        rule = {"host": "ratings", "trafficPolicy": {"loadBalancer": {"simple": "RANDOM"}}}
        write(config / "rule.yaml", [istio("DestinationRule", "ratings", "default", rule)])
        for client, proxy in zip(clients[:2], received, strict=True):
            assert isinstance(client, AdsClient)
            response = await client.recv(10)
            assert response.type_url == CDS
            received[proxy].append(response)
            client.ack(response)
        delta_push = await delta.recv(10)
        delta.send(CDS, nonce=delta_push.nonce)

        def settled() -> list[dict[str, Any]] | None:
            status = mp.get_json("/debug/syncz")
            acked = [s for s in status if s.get("cluster_sent") == s.get("cluster_acked")]
            return status if len(status) == 3 and len(acked) == 3 else None

        # In a thread: the clients' ACKs go out on this loop meanwhile.
        syncz = await asyncio.to_thread(eventually, settled, what="CDS acknowledged by all three")

        url = f"http://127.0.0.1:{mp.http_port}/debug/ui"
        dom = (await _chromium("--dump-dom", "--virtual-time-budget=3000", url)).decode()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "debug_ui.png"
        await _chromium(f"--screenshot={shot}", "--hide-scrollbars", url)
        (ARTIFACTS / "debug_ui.html").write_text(dom)
        print(f"\n/debug/ui screenshot: {shot}\n/debug/ui DOM: {ARTIFACTS / 'debug_ui.html'}")
        assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        for client in clients:
            await client.close()
        mp.stop()

    page = _Page()
    page.feed(dom)
    proxies = {r["attrs"]["data-proxy"]: r for r in page.rows if r["class"] == "proxy"}
    by_proxy = {s["proxy"]: s for s in syncz}
    assert (
        set(proxies)
        == set(by_proxy)
        == {"productpage-v1.default", "reviews-v1.default", "ratings-v1.default"}
    )
    for proxy, row in proxies.items():
        entry = by_proxy[proxy]
        for name, prefix in (("CDS", "cluster"), ("LDS", "listener"), ("EDS", "endpoint"), ("RDS", "route")):
            assert row["types"][name] == _expected_status(entry, prefix), (proxy, name, entry)
        assert row["cells"][3] == entry.get("istio_version", "")
    assert proxies["ratings-v1.default"]["types"]["LDS"] == "STALE"
    assert proxies["reviews-v1.default"]["types"]["LDS"] == "SYNCED"
    assert page.fields["connected"] == str(len(syncz))
    in_sync = sum(
        1
        for entry in syncz
        if all(
            _expected_status(entry, p) in ("SYNCED", "IGNORED")
            for p in ("cluster", "listener", "endpoint", "route")
        )
    )
    assert page.fields["synced"] == str(in_sync) == "2"

    # The push the DestinationRule set off: every proxy, with the bytes the clients were sent.
    pushes = [r for r in page.rows if r["class"] == "push"]
    assert pushes, dom
    latest = pushes[0]
    assert "DestinationRule default/ratings" in latest["cells"][2]
    assert latest["fields"]["proxies"] == "3"
    sotw_bytes = sum(r.ByteSize() for responses in received.values() for r in responses)
    assert int(latest["fields"]["bytes"]) == sotw_bytes + delta_push.ByteSize()
    assert float(latest["fields"]["duration"]) > 0
    # Each proxy's last push is that one, by the number the table gives it (with workers: the main
    # process's number, which each worker's record of the push carries).
    number = latest["attrs"]["data-number"]
    for proxy, row in proxies.items():
        assert row["cells"][10].startswith(f"#{number}: "), (proxy, row["cells"][10], number)
    slowest = [r["attrs"]["data-proxy"] for r in page.rows if r["class"] == "slow"]
    assert set(slowest) == set(proxies)
