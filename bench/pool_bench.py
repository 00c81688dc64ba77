"""The push-worker pool (issue 20): one fleet scenario over 1 and N push workers, side by side.

For each pool size the server starts on the scenario (``--push-workers N``; 1 is the single
process), the simulated fleet connects, and then an endpoint and a VirtualService change are made
``rounds`` times each. Every process's CPU is read from /proc around each push: the main process's
(it reads the files, debounces and builds its PushContext), and each worker's (it applies the change
log, builds its own PushContext and fans out to its streams). On this machine the workers and the
simulator share two cores, so the measured fan-out is not what the pool gives on a machine with a
core per worker; the slowest worker's push CPU is, and is reported as a projection of it. Which
worker holds a stream is read from the kernel (the socket's owner).

``python -m bench.pool_bench --suite quick|full`` runs the suite's pool jobs alone and puts their
results into ``bench/results/<suite>.json`` beside the rest of that suite's; ``bench.run`` runs them
with the suite.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from bench.fleet import Fleet
from bench.measure import DEBOUNCE, fleet_specs, latency_figures, log
from bench.scenario import Scenario, write_yaml
from bench.server import ServerProcess, process_cpu_seconds
from bench.sidecar import EDS, RDS
from bench.tables import fmt, get, goal_row, ratio, table

K = TypeVar("K")

#: The issue's goals for two workers, against the single process: the slowest worker's push CPU
#: (the fan-out with a core per worker), and all processes' CPU together.
SLOWEST_GOAL = 0.6
TOTAL_GOAL = 1.15
CHANGES = (("endpoint_added", "endpoint added"), ("virtual_service_changed", "VirtualService changed"))


@dataclass(frozen=True)
class PoolJob:
    scenario: Scenario
    #: Pool sizes, run one after the other on the same scenario (1: the single process).
    workers: tuple[int, ...] = (1, 2)
    #: Each change is made this many times per pool size.
    rounds: int = 3
    #: New streams per second for the server as a whole (each worker gets its share).
    connect_rate: int = 100
    settle_seconds: float = 2.0


# -- the processes ---------------------------------------------------------------------


def worker_pids(main_pid: int) -> list[int]:
    """The push workers of a main process: its children started by multiprocessing's spawn (not its
    resource tracker), oldest first."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == main_pid and b"spawn_main" in (entry / "cmdline").read_bytes():
                out.append(int(entry.name))
    return sorted(out)


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    """Resident memory (``VmHWM``: its peak) of a process, MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return 0.0


def streams_by_process(pids: Mapping[K, int], port: int) -> dict[K, int]:
    """Established TCP connections to ``port`` whose server end each process holds (keyed as
    ``pids``): which worker the kernel gave each stream to."""
    owner: dict[int, K] = {}
    for key, pid in pids.items():
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    owner[int(target[8:-1])] = key
    counts = dict.fromkeys(pids, 0)
    for table_path in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table_path).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], int(fields[9])
            # State 01 is ESTABLISHED; the listening sockets (0A) are not streams.
            if state == "01" and int(local.rsplit(":", 1)[1], 16) == port and inode in owner:
                counts[owner[inode]] += 1
    return counts


def load_average() -> list[float]:
    return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]


class Processes:
    """The server's main process and workers, and the CPU each has used."""

    def __init__(self, main: int, workers: list[int]) -> None:
        self.main = main
        self.workers = workers

    def cpu(self) -> tuple[float, list[float]]:
        return process_cpu_seconds(self.main), [process_cpu_seconds(p) for p in self.workers]

    def used_since(self, before: tuple[float, list[float]]) -> dict[str, Any]:
        main, workers = self.cpu()
        return {
            "main_cpu_seconds": round(main - before[0], 3),
            "worker_cpu_seconds": [round(w - b, 3) for w, b in zip(workers, before[1], strict=True)],
        }


# -- one pool size ---------------------------------------------------------------------


def _push(
    processes: Processes,
    fleet: Fleet,
    marker: bytes,
    type_url: str,
    expected: int,
    write: Callable[[], None],
) -> dict[str, Any]:
    """One change: each process's CPU from the write until every proxy has it, and the times."""
    fleet.arm(marker, type_url)
    before, fleet_cpu = processes.cpu(), fleet.cpu_seconds()
    started = time.time()
    write()
    times = fleet.wait_marker(expected, 120)
    out: dict[str, Any] = {
        "proxies": expected,
        **processes.used_since(before),
        "fleet_cpu_seconds": round(fleet.cpu_seconds() - fleet_cpu, 3),
    }
    seen = [t - started for t in times if t is not None]
    out["converged"] = len(seen)
    out.update(latency_figures(seen))
    time.sleep(1)  # the last ACKs land before the next change is measured
    return out


def run_size(job: PoolJob, workers: int, workdir: Path) -> dict[str, Any]:
    """The scenario over ``workers`` push workers: sync, then each change ``job.rounds`` times."""
    scenario = job.scenario
    config = workdir / "config"
    scenario.write(config)
    server = ServerProcess(
        config,
        workdir,
        extra=[
            "--debounce-after",
            DEBOUNCE,
            "--max-requests-per-second",
            str(job.connect_rate),
            "--push-workers",
            str(workers),
        ],
    )
    result: dict[str, Any] = {"workers": workers}
    fleet: Fleet | None = None
    try:
        result["ready_seconds"] = round(server.start(), 3)
        assert server.proc is not None
        processes = Processes(server.proc.pid, worker_pids(server.proc.pid) if workers > 1 else [])
        if len(processes.workers) != (workers if workers > 1 else 0):
            raise RuntimeError(f"expected {workers} push workers, found {processes.workers}")
        before = processes.cpu()
        fleet = Fleet(server.target, fleet_specs(scenario), scenario.route_names(), own_connections=True)
        fleet.start()
        result["sync_seconds"] = round(fleet.wait_synced(1200), 3)
        result["sync"] = processes.used_since(before)
        time.sleep(job.settle_seconds)
        serving = processes.workers or [processes.main]
        result["streams_per_worker"] = list(
            streams_by_process(dict(enumerate(serving)), server.grpc_port).values()
        )
        result["rss_mib"] = {
            "main": round(rss_mib(processes.main), 1),
            "workers": [round(rss_mib(p), 1) for p in processes.workers],
        }
        watchers = scenario.proxies_seeing(0)
        changes: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in CHANGES}
        for n in range(1, job.rounds + 1):
            # An endpoint more each round, and a new route name: both change what every proxy holds.
            new_ip = scenario.endpoint_ip(0, scenario.endpoints_of(0) + n - 1)
            endpoints = partial(
                write_yaml, config / "svc-0.yaml", scenario.service_objects(0, extra_endpoints=n)
            )
            changes["endpoint_added"].append(
                _push(processes, fleet, new_ip.encode(), EDS, watchers, endpoints)
            )
            marker = f"pool{n}"
            routes = partial(
                write_yaml,
                config / scenario.virtual_service_file(0),
                [scenario.virtual_service(0, marker=marker)],
            )
            changes["virtual_service_changed"].append(
                _push(processes, fleet, f"bench-{marker}".encode(), RDS, watchers, routes)
            )
        result.update(changes)
        result["peak_rss_mib"] = {
            "main": round(rss_mib(processes.main, "VmHWM"), 1),
            "workers": [round(rss_mib(p, "VmHWM"), 1) for p in processes.workers],
        }
        result["reconnects"] = fleet.status()["connects"] - scenario.proxies
    finally:
        try:
            if fleet is not None:
                fleet.stop()
        finally:
            result["exit_code"] = server.stop()
    return result


def run(job: PoolJob) -> dict[str, Any]:
    """Every pool size of the job, one after the other, with the machine's load around them."""
    out: dict[str, Any] = {
        "scenario": job.scenario.name,
        "scenario_spec": asdict(job.scenario),
        "rounds": job.rounds,
        "load_before": load_average(),
        "runs": [],
    }
    started = time.time()
    for workers in job.workers:
        log(f"pool {job.scenario.name} ({job.scenario.proxies} proxies), {workers} push worker(s)")
        with tempfile.TemporaryDirectory(prefix="meshpilot-bench-") as tmp:
            result = run_size(job, workers, Path(tmp))
        out["runs"].append(result)
        log(json.dumps({k: v for k, v in result.items() if k not in {name for name, _ in CHANGES}}))
    out["load_after"] = load_average()
    out["wall_seconds"] = round(time.time() - started, 1)
    return out


# -- the figures -----------------------------------------------------------------------


def push_figures(change: list[dict[str, Any]]) -> dict[str, float | None]:
    """Means over a change's rounds: main's CPU, the slowest worker's, all processes', and the
    measured fan-out and time from the write (p99 of each round)."""
    if not change:
        return {}

    def mean(values: list[float]) -> float:
        return statistics.fmean(values) if values else 0.0

    slowest = [max(r["worker_cpu_seconds"] or [r["main_cpu_seconds"]]) for r in change]
    total = [r["main_cpu_seconds"] + sum(r["worker_cpu_seconds"]) for r in change]
    per_worker = [w for r in change for w in r["worker_cpu_seconds"]]
    return {
        "main": mean([r["main_cpu_seconds"] for r in change]),
        "per_worker": mean(per_worker) if per_worker else None,
        "slowest": mean(slowest),
        "total": mean(total),
        "simulator": mean([r["fleet_cpu_seconds"] for r in change]),
        "fan_out_p99": mean([get(r, "fan_out_seconds", "p99") or 0.0 for r in change]),
        "from_write_p99": mean([get(r, "from_write_seconds", "p99") or 0.0 for r in change]),
        "converged": min(r["converged"] / max(1, r["proxies"]) for r in change),
    }


def _single(pool: dict[str, Any]) -> dict[str, Any] | None:
    return next((r for r in pool["runs"] if r["workers"] == 1), None)


def goals(results: dict[str, Any]) -> list[list[Any]]:
    """The issue's two goals for two workers, per change, from the first pool job of the suite."""
    pools: list[dict[str, Any]] = results.get("pool") or []
    if not pools:
        return []
    pool = pools[0]
    single, two = _single(pool), next((r for r in pool["runs"] if r["workers"] == 2), None)
    if single is None or two is None:
        return []
    rows = []
    # The pool job may be run apart from the suite (``--suite``), at another commit: say which.
    machine = pool.get("machine") or {}
    at = f" (commit {machine['commit']})" if "commit" in machine else ""
    for change, label in CHANGES:
        one, pair = push_figures(single.get(change) or []), push_figures(two.get(change) or [])
        if not one or not pair or not one["total"]:
            continue
        slowest = pair["slowest"] / one["total"] if pair["slowest"] is not None else None
        rows.append(
            goal_row(
                f"pool of 2{at}, {label}: slowest worker's push CPU / single process's",
                SLOWEST_GOAL,
                slowest,
                "x",
            )
        )
        total = pair["total"] / one["total"] if pair["total"] is not None else None
        rows.append(
            goal_row(
                f"pool of 2{at}, {label}: all processes' push CPU / single process's",
                TOTAL_GOAL,
                total,
                "x",
            )
        )
    return rows


def section(results: dict[str, Any]) -> list[str]:
    pools: list[dict[str, Any]] = results.get("pool") or []
    if not pools:
        return []
    out = ["### The push-worker pool", ""]
    out.append(
        "`bench/pool_bench.py`: the same scenario and fleet over a single process (1) and over a main "
        "process with push workers (`--push-workers N`), one after the other. Each change is made "
        "several times; the CPU of every process is read from /proc from the write until every "
        "proxy has the change, and averaged over the rounds. The main process reads the files, "
        "debounces and builds its own PushContext; each worker applies the change log, builds its "
        "PushContext and pushes to its streams. **The slowest worker's CPU is a projection**: it is "
        "the fan-out on a machine with a free core for each worker, computed from CPU measured here, "
        "where the workers and the simulator share two cores; the measured fan-out is beside it. "
        "Ratios are to the single process's CPU for the same change."
    )
    out.append("")
    for pool in pools:
        load = ", ".join(fmt(v) for v in pool.get("load_before") or [])
        after = ", ".join(fmt(v) for v in pool.get("load_after") or [])
        machine = pool.get("machine") or {}
        when = f"commit {machine['commit']}, {machine['date']}; " if machine else ""
        out.append(
            f"Scenario {pool['scenario']} ({get(pool, 'scenario_spec', 'proxies')} proxies, "
            f"{get(pool, 'scenario_spec', 'services')} services), {pool['rounds']} rounds of each change; "
            f"{when}load average (1, 5, 15 min) {load} before and {after} after."
        )
        out.append("")
        rows = []
        for run in pool["runs"]:
            workers = run["workers"]
            rows.append(
                [
                    workers,
                    run.get("ready_seconds"),
                    run.get("sync_seconds"),
                    " / ".join(str(n) for n in run.get("streams_per_worker") or []),
                    get(run, "rss_mib", "main"),
                    " / ".join(fmt(v, 1) for v in get(run, "rss_mib", "workers") or []) or "-",
                    get(run, "sync", "main_cpu_seconds"),
                    " / ".join(fmt(v) for v in get(run, "sync", "worker_cpu_seconds") or []) or "-",
                ]
            )
        out += table(
            [
                "workers",
                "ready s",
                "fleet synced s",
                "streams per worker",
                "RSS main (or single) MiB",
                "RSS per worker MiB",
                "sync CPU main s",
                "sync CPU per worker s",
            ],
            rows,
        )
        single = _single(pool)
        for change, label in CHANGES:
            base = push_figures(single.get(change) or []) if single else {}
            rows = []
            for run in pool["runs"]:
                f = push_figures(run.get(change) or [])
                if not f:
                    continue
                rows.append(
                    [
                        run["workers"],
                        f["main"],
                        f["per_worker"] if run["workers"] > 1 else "-",
                        f["slowest"],
                        ratio(f["slowest"], base.get("total")),
                        f["total"],
                        ratio(f["total"], base.get("total")),
                        f["fan_out_p99"],
                        f["from_write_p99"],
                        f["simulator"],
                        f"{f['converged']:.0%}",
                    ]
                )
            if not rows:
                continue
            out += [f"{label[0].upper()}{label[1:]}:", ""]
            out += table(
                [
                    "workers",
                    "main (or single) CPU s",
                    "CPU per worker s",
                    "slowest worker s (projected fan-out)",
                    "slowest / single",
                    "all processes s",
                    "all / single",
                    "measured fan-out p99 s",
                    "from write p99 s",
                    "simulator CPU s",
                    "converged",
                ],
                rows,
            )
    return out


# -- on its own ------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    from bench.run import RESULTS, machine, suites

    parser = argparse.ArgumentParser(prog="python -m bench.pool_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--suite", choices=sorted(suites()), default="quick")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--no-report", action="store_true", help="do not rewrite docs/benchmarks.md")
    args = parser.parse_args(argv)
    suite = suites(args.scale)[args.suite]
    pools = [{**run(job), "machine": machine()} for job in suite.pool]
    path = args.out / f"{suite.name}.json"
    results = json.loads(path.read_text()) if path.exists() else {"suite": suite.name, "machine": machine()}
    results["pool"] = pools
    args.out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, sort_keys=False) + "\n")
    log(f"wrote the pool runs into {path}")
    if not args.no_report:
        from bench.report import write_report

        write_report(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
