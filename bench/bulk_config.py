"""Thousands of objects in one config file, added and then removed while a canary proxy is connected.

Issue 21 found that 10,000 ServiceEntries in one file froze the server for over a minute, on add and
again on remove. This job measures it as ``docs/reliability.md`` reports it: a server process whose
config directory already holds the canary's mesh, one sidecar (ADS, state of the world) subscribed
to everything, then one file of ``scenario.services`` ServiceEntries moved into the directory, and
later deleted. For each change: the seconds from the file system change to the canary's CDS push
that carries (or no longer carries) them, and the longest stall of the server's event loop meanwhile.
The server's resident memory is read before the add, after it, and after the remove.

The stall is seen from outside: a thread asks for ``/version`` on the monitoring port, which the
main loop answers, every 20 ms; the longest round trip (less the poll interval it could have waited
behind) is the loop's longest stall to within that interval. Probes on the HTTP port would not do:
they are answered on a thread of their own.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from envoy.service.discovery.v3 import discovery_pb2

from bench.measure import DEBOUNCE, fleet_specs, log
from bench.scenario import Scenario, write_yaml
from bench.server import ServerProcess
from bench.sidecar import CDS
from bench.tables import table

ADS_METHOD = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
#: How often the stall probe asks the main loop for /version.
POLL_SECONDS = 0.02
#: Each change must reach the canary within this, or the job fails (issue 21's figure was ~75 s).
CHANGE_TIMEOUT = 300.0


@dataclass(frozen=True)
class BulkJob:
    """``scenario.services`` objects of ``kind`` (ServiceEntries, the only kind so far) in one file
    (``scenario.extra['one_file']``), seen by one canary."""

    scenario: Scenario
    kind: str = "ServiceEntry"

    @property
    def file_name(self) -> str:
        return str(self.scenario.extra.get("one_file", f"{self.scenario.name}.yaml"))


class LoopProbe(threading.Thread):
    """The longest round trip of ``ask`` (a request the server's main loop answers, such as
    /version on the monitoring port) while running; see the module docstring."""

    def __init__(self, ask: Callable[[], object]) -> None:
        super().__init__(daemon=True, name="loop-probe")
        self.ask = ask
        self.worst = 0.0
        self._done = threading.Event()

    def reset(self) -> None:
        self.worst = 0.0

    def run(self) -> None:
        while not self._done.wait(POLL_SECONDS):
            started = time.perf_counter()
            try:
                self.ask()
            except OSError:
                continue
            self.worst = max(self.worst, time.perf_counter() - started)

    def stop(self) -> None:
        self._done.set()
        if self.ident is not None:  # started
            self.join(CHANGE_TIMEOUT)

    @property
    def stall(self) -> float:
        """The longest stall seen since the last ``reset``, less the interval a request may wait."""
        return max(0.0, self.worst - POLL_SECONDS)


class Canary:
    """One state-of-the-world sidecar subscribed to CDS, ACKing every push."""

    def __init__(self, target: str, scenario: Scenario) -> None:
        self.spec = fleet_specs(Scenario(**{**scenario.__dict__, "proxies": 1}))[0]
        self.channel = grpc.aio.insecure_channel(target, options=[("grpc.max_receive_message_length", -1)])
        self._out: asyncio.Queue[discovery_pb2.DiscoveryRequest] = asyncio.Queue()
        self.call = self.channel.stream_stream(
            ADS_METHOD,
            request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
            response_deserializer=discovery_pb2.DiscoveryResponse.FromString,
        )(self._requests())
        self.clusters = -1
        self._changed = asyncio.Event()
        self._reader = asyncio.get_running_loop().create_task(self._read())
        self._out.put_nowait(discovery_pb2.DiscoveryRequest(type_url=CDS, node=self.spec.node()))

    async def _requests(self) -> Any:
        while True:
            yield await self._out.get()

    async def _read(self) -> None:
        async for response in self.call:
            if response.type_url != CDS:
                continue
            self._out.put_nowait(
                discovery_pb2.DiscoveryRequest(
                    type_url=CDS, version_info=response.version_info, response_nonce=response.nonce
                )
            )
            self.clusters = len(response.resources)
            self._changed.set()

    async def until(self, done: Any, timeout: float = CHANGE_TIMEOUT) -> float:
        """Wait for a CDS push whose cluster count satisfies ``done``; the time it arrived."""
        deadline = time.monotonic() + timeout
        while not done(self.clusters):
            self._changed.clear()
            if self._reader.done():
                self._reader.result()
                raise RuntimeError("the canary's stream ended")
            await asyncio.wait_for(self._changed.wait(), max(0.01, deadline - time.monotonic()))
        return time.monotonic()

    async def close(self) -> None:
        self.call.cancel()
        self._reader.cancel()
        await self.channel.close()


def _rss_mib(server: ServerProcess) -> float:
    return round(server.memory()["rss_mib"], 1)


async def _measure(job: BulkJob, server: ServerProcess, config: Path, staged: Path) -> dict[str, Any]:
    count = job.scenario.services
    canary = Canary(server.target, job.scenario)
    probe = LoopProbe(lambda: server.get("/version", server.monitoring_port, timeout=CHANGE_TIMEOUT))
    try:
        await canary.until(lambda n: n >= 0)
        base = canary.clusters
        await asyncio.sleep(2.0)  # settle: the startup's pushes and collections are over
        out: dict[str, Any] = {"clusters_before": canary.clusters, "rss_mib_before": _rss_mib(server)}
        probe.start()
        for change in ("add", "remove"):
            probe.reset()
            changed = time.monotonic()
            if change == "add":
                await asyncio.to_thread(staged.replace, config / job.file_name)
                arrived = await canary.until(lambda n: n >= base + count)
            else:
                await asyncio.to_thread((config / job.file_name).unlink)
                arrived = await canary.until(lambda n: n <= base)
            await asyncio.sleep(1.0)  # the push's own tail: anything the loop does right after it
            out[change] = {
                "push_seconds": round(arrived - changed, 3),
                "loop_stall_seconds": round(probe.stall, 3),
                "clusters": canary.clusters,
            }
            out[f"rss_mib_after_{change}"] = _rss_mib(server)
            log(f"{count} ServiceEntries, {change}: {out[change]}, RSS {out[f'rss_mib_after_{change}']} MiB")
        out["peak_rss_mib"] = round(server.memory()["peak_rss_mib"], 1)
        return out
    finally:
        probe.stop()
        await canary.close()


def run(job: BulkJob) -> dict[str, Any]:
    """The job in a fresh server; the figures for bench/results (see the module docstring)."""
    scenario = job.scenario
    with tempfile.TemporaryDirectory(prefix="meshpilot-bench-") as tmp:
        workdir = Path(tmp)
        config = workdir / "config"
        # The canary's own service only: the bulk file is the change.
        Scenario(**{**scenario.__dict__, "services": 1}).write(config)
        staged = workdir / f"staged-{job.file_name}"
        # Services 1..count: service 0 is the canary's, already in the directory.
        write_yaml(staged, [scenario.service_entry(s) for s in range(1, scenario.services + 1)])
        file_bytes = staged.stat().st_size
        server = ServerProcess(config, workdir, extra=["--debounce-after", DEBOUNCE])
        try:
            ready = server.start()
            result = asyncio.run(_measure(job, server, config, staged))
        finally:
            server.stop()
    return {
        "scenario": scenario.name,
        "objects": scenario.services,
        "kind": job.kind,
        "file_bytes": file_bytes,
        "ready_seconds": round(ready, 2),
        **result,
    }


def section(results: dict[str, Any]) -> list[str]:
    """The docs/benchmarks.md table of this job's runs, if the suite ran it."""
    runs = results.get("bulk") or []
    if not runs:
        return []
    out = ["### Thousands of objects in one config file", ""]
    out.append(
        "One file of ServiceEntries moved into the config directory of a running server, then deleted "
        "(issue 21: 10,000 of them stalled the loop for over a minute each way). One sidecar sees them "
        "all; seconds from the change to its CDS push, the event loop's longest stall meanwhile (from "
        "`/version` round trips on the monitoring port, polled every 20 ms), and the server's RSS."
    )
    out.append("")
    rows = []
    for run in runs:
        for change in ("add", "remove"):
            data = run.get(change) or {}
            rows.append(
                [
                    f"{run['objects']:,} {run['kind']}",
                    change,
                    data.get("push_seconds"),
                    data.get("loop_stall_seconds"),
                    run.get("rss_mib_before") if change == "add" else run.get("rss_mib_after_add"),
                    run.get(f"rss_mib_after_{change}"),
                ]
            )
    out += table(
        ["objects", "change", "canary's push s", "longest loop stall s", "RSS before MiB", "RSS after MiB"],
        rows,
    )
    return out
