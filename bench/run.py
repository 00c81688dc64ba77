"""The benchmark suites: ``python -m bench.run --suite quick|full``.

Each figure is measured in this run next to its reference: compiled hot
paths against their pure-Python twins (micro benchmarks, and whole servers
with ``MESHPILOT_NO_EXTENSIONS=1``), wire encoding against protobuf objects,
the XdsCache on against off. Fleet runs start a real server process, connect
the simulated fleet over ADS, and read the server's CPU time and memory from
/proc. Results go to ``bench/results/<suite>.json``; ``bench.report`` turns
them into ``docs/benchmarks.md`` and its plots.

Fleet jobs with ``delta`` variants run each of those twice, side by side: over
state-of-the-world ADS and over delta xDS (``bench.fleet_delta``), and the
bare-gRPC floor runs at the bytes each protocol's pushes measured, a round of
the floor right after each round of the push it stands for (``FloorsBeside``).

``--peer istiod`` adds, for each fleet scenario of the suite, a run of istiod
(``pilot-discovery`` from ``make reference``) and one of meshpilot, one after
the other, on the ServiceEntry form of the scenario (see ``bench.istiod``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bench import bulk_config, grpc_floor, pool_bench
from bench import ca as ca_bench
from bench import istiod as peer_istiod
from bench.ca_job import CaJob
from bench.fleet import ack_bytes
from bench.fleet_delta import delta_ack_bytes
from bench.fleet_run import COMPILED, ISTIOD, NO_CACHE, PURE, FleetJob, Variant, run_fleet
from bench.kube_stub import KubeStub
from bench.measure import DEBOUNCE, host_speed, log
from bench.scenario import Scenario
from bench.sidecar import EDS, PROTOCOLS, RDS
from bench.storm import StormJob, run_storm
from meshpilot.server import allocator

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "bench" / "scenarios"
RESULTS = ROOT / "bench" / "results"


PEERS = {"istiod": ISTIOD}


@dataclass(frozen=True)
class FloorJob:
    """Bare grpc.aio pushing to as many streams as the http fleet has (see bench.grpc_floor)."""

    streams: int
    #: The size of one push's response in the http scenario (an estimate; see ``sized``).
    message_bytes: int
    #: The size of the ACK a sidecar answers it with.
    ack_bytes: int
    #: Which push of the http scenario it stands for.
    stands_for: str
    #: Rounds when it runs on its own; beside its fleet run it runs one after each of the fleet's.
    rounds: int = 5
    #: The protocol whose push and ACK sizes these are.
    protocol: str = "sotw"
    #: The fleet run and change it stands for: its measured sizes replace the estimates.
    scenario: str = "http"
    change: str = "endpoint_added"

    def stands_beside(self, run: dict[str, Any]) -> bool:
        """Whether ``run`` is the fleet run whose push this floor stands for: its scenario and
        protocol, served by the compiled server."""
        return (run["scenario"], run["variant"], run.get("protocol", "sotw")) == (
            self.scenario,
            COMPILED.name,
            self.protocol,
        )

    def sized(self, fleet_runs: list[dict[str, Any]]) -> tuple[FloorJob, str]:
        """The job at the bytes per proxy its push and ACKs measured in this run's fleet run of the
        same scenario, change and protocol (compiled server), and where the sizes came from."""
        for run in fleet_runs:
            sized = self.at(run.get(self.change) or {}) if self.stands_beside(run) else None
            if sized is not None:
                return sized, "the fleet run"
        return self, "estimate"

    def at(self, measured: dict[str, Any]) -> FloorJob | None:
        """The job at the bytes per proxy a push measured each way (a change's figures, or one
        round's); None when it put nothing on the wire."""
        received, sent = measured.get("bytes_per_proxy"), measured.get("sent_bytes_per_proxy")
        if not received or not sent:
            return None
        return replace(self, message_bytes=int(received), ack_bytes=int(sent))


def _floors(http: Scenario) -> tuple[FloorJob, ...]:
    # Estimates of the http scenario's responses, as pilot_xds_config_size_bytes measured them: an
    # added endpoint's EDS (1,305 bytes) and, after a VirtualService change, the RDS of the one route
    # that holds every service's virtual host (517 KB at 1,000 services); that much data to every
    # proxy is most of what such a push costs. The ACKs are the simulator's own: a state-of-the-world
    # EDS ACK names every cluster again (47 KB at 1,000 services), which the server reads and
    # compares too; a delta ACK is the type and the nonce. Where the suite ran the http fleet over
    # the protocol, the sizes it measured replace these (``FloorJob.sized``).
    version = "2026-01-01T00:00:00Z/100"
    nonce = f"{version}-{'0' * 32}"
    out = []
    for protocol in ("sotw", "delta"):
        if protocol == "sotw":
            eds_ack = ack_bytes(EDS, http.outbound_clusters(), version, nonce)
            rds_ack = ack_bytes(RDS, http.route_names(), version, nonce)
        else:
            eds_ack, rds_ack = delta_ack_bytes(EDS, nonce), delta_ack_bytes(RDS, nonce)
        endpoint = FloorJob(http.proxies, 1305, eds_ack, "endpoint added (EDS)", protocol=protocol)
        routes = FloorJob(
            http.proxies,
            517 * http.services,
            rds_ack,
            "VirtualService changed (RDS)",
            rounds=3,
            protocol=protocol,
            change="virtual_service_changed",
        )
        out += [replace(endpoint, scenario=http.name), replace(routes, scenario=http.name)]
    return tuple(out)


@dataclass(frozen=True)
class Suite:
    name: str
    micro_min_time: float
    fleet: tuple[FleetJob, ...]
    storm: tuple[StormJob, ...]
    floor: tuple[FloorJob, ...] = ()
    #: The mesh CA's signing rate and certificate storm (bench.ca).
    ca: CaJob | None = None
    #: Thousands of objects in one config file, added and removed (bench.bulk_config).
    bulk: tuple[bulk_config.BulkJob, ...] = ()
    #: A fleet over 1 and N push workers, side by side (bench.pool_bench).
    pool: tuple[pool_bench.PoolJob, ...] = ()


def _scenario(file: str, scale: float = 1.0, **overrides: Any) -> Scenario:
    """A scenario from bench/scenarios, with some fields replaced (a scaled-down quick run), scaled."""
    base = Scenario.load(SCENARIOS / f"{file}.yaml")
    scenario = Scenario(**{**base.__dict__, **overrides})
    return scenario.scaled(scale) if scale != 1.0 else scenario


def peer_jobs(suite: Suite, peer: Variant) -> tuple[FleetJob, ...]:
    """The suite's fleet scenarios in their ServiceEntry form, each for meshpilot and then the peer."""
    jobs = []
    for job in suite.fleet:
        scenario = job.scenario
        se = Scenario(**{**scenario.__dict__, "service_entries": True, "name": f"{scenario.name}-se"})
        # Both protocols for both servers: delta is what stock sidecars of Istio 1.22+ speak.
        both = (COMPILED, peer)
        jobs.append(replace(job, scenario=se, variants=both, delta=both, reconnect=False))
    return tuple(jobs)


def _both(scenario: Scenario, variants: tuple[Variant, ...], rounds: int = 1) -> FleetJob:
    """A job whose compiled server also runs with delta sidecars, and whose streams drop at the end."""
    return FleetJob(scenario, variants, delta=(COMPILED,), reconnect=True, rounds=rounds)


def suites(scale: float = 1.0) -> dict[str, Suite]:
    """The suites; ``scale`` shrinks every fleet scenario (services, proxies) for a smoke run."""
    quick_http = _scenario("http", scale, services=200, proxies=400, name="http-200")
    full_http = _scenario("http", scale)
    return {
        "quick": Suite(
            "quick",
            micro_min_time=0.1,
            # Delta beside state-of-the-world, but no reconnect: the quick suite stays short.
            fleet=(FleetJob(quick_http, (COMPILED, PURE, NO_CACHE), delta=(COMPILED,), steady_seconds=5),),
            storm=(StormJob(_scenario("storm", scale, proxies=1000, name="storm-1000")),),
            floor=_floors(quick_http),
            ca=CaJob(sign_count=100, workloads=500),
            bulk=(bulk_config.BulkJob(_scenario("se-10k", scale, services=2500, name="se-2500")),),
            pool=(pool_bench.PoolJob(quick_http, rounds=2),),
        ),
        "full": Suite(
            "full",
            micro_min_time=0.2,
            fleet=(
                # The goals' scenario: its pushes are made five times (see FleetJob.rounds).
                _both(full_http, (COMPILED, PURE, NO_CACHE), rounds=5),
                _both(_scenario("http-dr", scale), (COMPILED,)),
                _both(_scenario("tcp", scale), (COMPILED,)),
                _both(_scenario("scoped", scale), (COMPILED,)),
                FleetJob(_scenario("gateways", scale), (COMPILED,)),
                FleetJob(_scenario("eds-1", scale), (COMPILED, PURE)),
                FleetJob(_scenario("eds-100", scale), (COMPILED, PURE)),
                FleetJob(_scenario("eds-1000", scale), (COMPILED, PURE)),
            ),
            storm=(StormJob(_scenario("storm", scale)),),
            floor=_floors(full_http),
            ca=CaJob(sign_count=300, workloads=2000),
            bulk=(bulk_config.BulkJob(_scenario("se-10k", scale)),),
            pool=(pool_bench.PoolJob(full_http),),
        ),
    }


def run_micro(pure: bool, min_time: float) -> dict[str, Any]:
    env = {**os.environ, "BENCH_MIN_TIME": str(min_time)}
    if pure:
        env["MESHPILOT_NO_EXTENSIONS"] = "1"
    out = subprocess.run(
        [sys.executable, "-m", "bench.micro"], cwd=ROOT, env=env, check=True, capture_output=True, text=True
    )
    data: dict[str, Any] = json.loads(out.stdout)
    return data


# -- the suite -------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    return {
        "cpus": os.cpu_count(),
        # What the servers started here run on (``meshpilot discovery`` preloads jemalloc when it is
        # installed): with glibc's allocator instead, each write of a response over 128 KiB maps fresh
        # pages, which doubled the route push's server CPU (bench/notes.md).
        "server_allocator": allocator.for_new_process().describe(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "commit": commit,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def run_peer(suite: Suite, peer: Variant, only: set[str] | None) -> dict[str, Any]:
    """The suite's fleet scenarios, ServiceEntry form, meshpilot then the peer, one run each."""
    info = peer_istiod.version()
    measured = machine()
    out: dict[str, Any] = {
        "server": peer.name,
        "version": info,
        # Named apart from the suite's: a peer run made alone may be merged into a suite's results.
        "commit": measured.get("commit"),
        "date": measured.get("date"),
        "binary": str(peer_istiod.binary().relative_to(ROOT)),
        "debounce": DEBOUNCE,
        "runs": [],
    }
    for job in peer_jobs(suite, peer):
        if only and not ({"peer", job.scenario.name, job.scenario.name.removesuffix("-se")} & only):
            continue
        for variant, protocol in job.runs():
            scenario = job.scenario
            log(f"peer fleet {scenario.name} ({scenario.proxies} proxies), {variant.name}, {protocol}")
            # The stub runs beside both servers, though only istiod talks to it, so the machine
            # is the same for both (its CPU is recorded, and counted for neither).
            with (
                tempfile.TemporaryDirectory(prefix="meshpilot-bench-") as tmp,
                KubeStub(Path(tmp) / "kube") as kube,
            ):
                cpu = kube.cpu_seconds()
                result = run_fleet(job, variant, Path(tmp), kube, protocol)
                result["kube_stub_cpu_seconds"] = round(kube.cpu_seconds() - cpu, 3)
            out["runs"].append({"scenario_spec": asdict(job.scenario), **result})
            log(json.dumps({k: v for k, v in result.items() if not isinstance(v, dict)}))
    return out


def _floor_result(job: FloorJob, sized_from: str, found: dict[str, Any]) -> dict[str, Any]:
    return {
        "stands_for": job.stands_for,
        "protocol": job.protocol,
        "scenario": job.scenario,
        "change": job.change,
        "sized_from": sized_from,
        **found,
    }


class FloorsBeside:
    """The floors that stand beside one fleet run, each measured a round at a time right after each
    round of its push (``run_fleet``'s ``after_round``), at the bytes of the first round that put
    any on the wire.

    Run after the fleet, a floor met the host of minutes later; run after all the fleets, of twenty
    minutes later, and the route push's ratio to it moved by a quarter between two runs while
    meshpilot's CPU did not (bench/notes.md). Round beside round, each ratio's two sides meet the
    host in the same minute. A floor's first round after it connects is a warm-up, kept apart (it
    cost up to twice the others, state-of-the-world's large ACKs most); its server and clients then
    wait, connected and idle, through the fleet's next rounds, and go once it measured as many
    rounds as the fleet makes (``rounds``), before the fleet's reconnect and its peak RSS reading.
    The fleet's server and sidecars wait, idle, through each floor round."""

    def __init__(self, floors: dict[int, FloorJob], rounds: int) -> None:
        #: The floors by their place in the suite (two equal jobs are each measured).
        self._floors = floors
        self._rounds = rounds
        self._open: dict[int, grpc_floor.Floor] = {}
        #: Rounds of each change made so far (which one sized a floor).
        self._made: dict[str, int] = {}
        #: What each floor measured, by its place in the suite: only floors whose push was made.
        self.results: dict[int, dict[str, Any]] = {}

    def __enter__(self) -> FloorsBeside:
        return self

    def __exit__(self, *exc: object) -> None:
        for floor in self._open.values():
            floor.close()

    def after_round(self, change: str, measured: dict[str, Any]) -> None:
        made = self._made[change] = self._made.get(change, 0) + 1
        for index, job in self._floors.items():
            if job.change != change:
                continue
            found = self.results.get(index)
            if found is None:
                sized = job.at(measured)
                if sized is None:
                    continue  # nothing reached the proxies: the next round sizes it
                log(
                    f"gRPC floor, {sized.protocol}, {sized.streams} streams, {sized.message_bytes} B out, "
                    f"{sized.ack_bytes} B ACKs, a round after each round of the fleet's {change}"
                )
                floor = self._open[index] = grpc_floor.Floor(
                    sized.streams, sized.message_bytes, sized.ack_bytes
                ).start()
                round_name = "first round" if made == 1 else f"round {made}"
                found = self.results[index] = _floor_result(
                    sized,
                    f"the fleet run's {round_name}",
                    {**floor.described, "rounds": []},
                )
            measuring = self._open.get(index)
            if measuring is None:
                continue  # measured all its rounds
            found["rounds"].append(measuring.round())
            log(json.dumps(found["rounds"][-1]))
            if len(found["rounds"]) >= self._rounds:
                self._open.pop(index).close()


def run_floors(floors: tuple[FloorJob, ...], fleet_runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The floor at each push's bytes: measured by this run's fleet where it ran the push, else estimated."""
    out = []
    for job in floors:
        floor, sized_from = job.sized(fleet_runs)
        log(
            f"gRPC floor, {floor.protocol}, {floor.streams} streams, {floor.message_bytes} B out, "
            f"{floor.ack_bytes} B ACKs (sized from {sized_from})"
        )
        found = grpc_floor.run(floor.streams, floor.message_bytes, floor.ack_bytes, floor.rounds)
        out.append(_floor_result(floor, sized_from, found))
        log(json.dumps(found["rounds"]))
    return out


def run_suite(
    suite: Suite,
    only: set[str] | None,
    peer: Variant | None = None,
    protocols: tuple[str, ...] = ("sotw", "delta"),
) -> dict[str, Any]:
    results: dict[str, Any] = {"suite": suite.name, "machine": machine(), "fleet": [], "storm": []}
    speed_before = host_speed()
    started = time.time()
    if not only or "micro" in only:
        log("micro benchmarks, compiled")
        measured = machine()
        results["micro"] = {
            "commit": measured.get("commit"),
            "date": measured.get("date"),
            "compiled": run_micro(False, suite.micro_min_time),
        }
        log("micro benchmarks, pure Python")
        results["micro"]["pure-python"] = run_micro(True, suite.micro_min_time)
    # Each floor is measured round beside round with the fleet run it stands beside (FloorsBeside). A
    # floor whose push no fleet run made runs last, at its estimated bytes. Floors are told apart by
    # their place in the suite.
    floors = [f for f in suite.floor if f.protocol in protocols] if not only or "floor" in only else []
    floors_run: dict[int, dict[str, Any]] = {}
    for job in suite.fleet:
        if only and job.scenario.name not in only and "fleet" not in only:
            continue
        for variant, protocol in job.runs():
            if protocol not in protocols:
                continue
            log(f"fleet {job.scenario.name} ({job.scenario.proxies} proxies), {variant.name}, {protocol}")
            this_run = {"scenario": job.scenario.name, "variant": variant.name, "protocol": protocol}
            beside = {i: f for i, f in enumerate(floors) if i not in floors_run and f.stands_beside(this_run)}
            with (
                tempfile.TemporaryDirectory(prefix="meshpilot-bench-") as tmp,
                FloorsBeside(beside, job.rounds) as measured_beside,
            ):
                result = run_fleet(
                    job, variant, Path(tmp), protocol=protocol, after_round=measured_beside.after_round
                )
            floors_run.update(measured_beside.results)
            results["fleet"].append({"scenario_spec": asdict(job.scenario), **result})
            log(json.dumps({k: v for k, v in result.items() if not isinstance(v, dict)}))
    if floors:
        todo = [i for i in range(len(floors)) if i not in floors_run]
        found = run_floors(tuple(floors[i] for i in todo), results["fleet"])
        floors_run.update(zip(todo, found, strict=True))
        results["grpc_floor"] = [floors_run[i] for i in range(len(floors))]
    if peer is not None:
        results["peer"] = run_peer(suite, peer, only)
    for storm in suite.storm:
        if only and storm.scenario.name not in only and "storm" not in only:
            continue
        log(f"reconnect storm, {storm.scenario.proxies} streams")
        with tempfile.TemporaryDirectory(prefix="meshpilot-bench-") as tmp:
            result = run_storm(storm, Path(tmp))
        results["storm"].append({"scenario_spec": asdict(storm.scenario), **result})
        log(json.dumps({k: v for k, v in result.items() if not isinstance(v, dict)}))
    if suite.ca is not None and (not only or "ca" in only):
        results["ca"] = ca_bench.run(suite.ca)
    for bulk in suite.bulk:
        if only and bulk.scenario.name not in only and "bulk" not in only:
            continue
        log(f"bulk config, {bulk.scenario.services} objects of kind {bulk.kind} in one file")
        results.setdefault("bulk", []).append(bulk_config.run(bulk))
    for pool in suite.pool:
        if only and pool.scenario.name not in only and "pool" not in only:
            continue
        results.setdefault("pool", []).append(pool_bench.run(pool))
    results["wall_seconds"] = round(time.time() - started, 1)
    results["machine"]["host_speed_seconds"] = {"before": speed_before, "after": host_speed()}
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    parser.add_argument("--suite", choices=sorted(suites()), default="quick")
    parser.add_argument(
        "--only", nargs="*", help="micro, floor, fleet, peer, storm, ca, bulk, pool or scenario names"
    )
    parser.add_argument(
        "--peer",
        choices=sorted(PEERS),
        help="also run the fleet scenarios, ServiceEntry form, on this server and on meshpilot, side by side",
    )
    parser.add_argument(
        "--protocols",
        nargs="+",
        choices=PROTOCOLS,
        default=list(PROTOCOLS),
        help="the xDS protocols the fleets speak (jobs with delta variants run both by default)",
    )
    parser.add_argument(
        "--scale", type=float, default=1.0, help="shrink every fleet scenario by this factor (a smoke run)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--no-report", action="store_true", help="do not rewrite docs/benchmarks.md")
    args = parser.parse_args(argv)
    suite = suites(args.scale)[args.suite]
    peer = PEERS[args.peer] if args.peer else None
    if peer is not None:
        try:
            peer_istiod.binary()
        except peer_istiod.MissingReference as err:
            parser.error(str(err))
    results = run_suite(suite, set(args.only) if args.only else None, peer, tuple(args.protocols))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{suite.name}.json"
    path.write_text(json.dumps(results, indent=2, sort_keys=False) + "\n")
    log(f"wrote {path} in {results['wall_seconds']} s")
    if not args.no_report:
        from bench.report import write_report

        write_report(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
