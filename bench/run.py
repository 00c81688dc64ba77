"""The benchmark suites: ``python -m bench.run --suite quick|full``.

Each figure is measured in this run next to its reference: compiled hot
paths against their pure-Python twins (micro benchmarks, and whole servers
with ``MESHPILOT_NO_EXTENSIONS=1``), wire encoding against protobuf objects,
the XdsCache on against off. Fleet runs start a real server process, connect
the simulated fleet over ADS, and read the server's CPU time and memory from
/proc. Results go to ``bench/results/<suite>.json``; ``bench.report`` turns
them into ``docs/benchmarks.md`` and its plots.

``--peer istiod`` adds, for each fleet scenario of the suite, a run of istiod
(``pilot-discovery`` from ``make reference``) and one of meshpilot, one after
the other, on the ServiceEntry form of the scenario (see ``bench.istiod``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from bench import ca as ca_bench
from bench import grpc_floor
from bench import istiod as peer_istiod
from bench.ca_job import CaJob
from bench.fleet import EDS, RDS, TYPES, Fleet, ack_bytes
from bench.kube_stub import KubeStub
from bench.measure import DEBOUNCE, fleet_specs, log, summary
from bench.scenario import Scenario, write_yaml
from bench.server import ServerProcess
from bench.storm import StormJob, run_storm

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "bench" / "scenarios"
RESULTS = ROOT / "bench" / "results"


@dataclass(frozen=True)
class Variant:
    """One way to run the server: its label, environment and extra flags."""

    name: str
    env: dict[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    #: Which program serves: "meshpilot" or "istiod" (``pilot-discovery``).
    server: str = "meshpilot"


COMPILED = Variant("compiled")
PURE = Variant("pure-python", {"MESHPILOT_NO_EXTENSIONS": "1"})
#: PILOT_XDS_CACHE_SIZE=0: no XdsCache and nothing shared between proxies (the uncached reference).
NO_CACHE = Variant("compiled, uncached", args=("--xds-cache-size", "0"))
#: istiod with its defaults (XdsCache on), the debounce and stream rate set as meshpilot's.
ISTIOD = Variant("istiod", server="istiod")
PEERS = {"istiod": ISTIOD}


@dataclass(frozen=True)
class FleetJob:
    scenario: Scenario
    variants: tuple[Variant, ...]
    #: New streams per second while the fleet connects; None keeps istiod's default.
    connect_rate: int | None = 100
    steady_seconds: float = 10.0
    changes: bool = True
    #: Wait after the initial sync before the steady state is measured.
    settle_seconds: float = 2.0


@dataclass(frozen=True)
class FloorJob:
    """Bare grpc.aio pushing to as many streams as the http fleet has (see bench.grpc_floor)."""

    streams: int
    #: The size of one push's response in the http scenario.
    message_bytes: int
    #: The size of the ACK a sidecar answers it with.
    ack_bytes: int
    #: Which push of the http scenario it stands for.
    stands_for: str
    rounds: int = 5


def _floors(http: Scenario) -> tuple[FloorJob, ...]:
    # The http scenario's responses, as pilot_xds_config_size_bytes measured them: an added
    # endpoint's EDS (1,305 bytes) and, after a VirtualService change, the RDS of the one route
    # that holds every service's virtual host (517 KB at 1,000 services); that much data to every
    # proxy is most of what such a push costs. The ACKs are the simulator's own: an EDS ACK names
    # every cluster again (47 KB at 1,000 services), which the server reads and compares too.
    version = "2026-01-01T00:00:00Z/100"
    nonce = f"{version}-{'0' * 32}"
    eds_ack = ack_bytes(EDS, http.outbound_clusters(), version, nonce)
    rds_ack = ack_bytes(RDS, http.route_names(), version, nonce)
    endpoint = FloorJob(http.proxies, 1305, eds_ack, "endpoint added (EDS)")
    routes = FloorJob(http.proxies, 517 * http.services, rds_ack, "VirtualService changed (RDS)", rounds=3)
    return endpoint, routes


@dataclass(frozen=True)
class Suite:
    name: str
    micro_min_time: float
    fleet: tuple[FleetJob, ...]
    storm: tuple[StormJob, ...]
    floor: tuple[FloorJob, ...] = ()
    #: The mesh CA's signing rate and certificate storm (bench.ca).
    ca: CaJob | None = None


def _scenario(file: str, **overrides: Any) -> Scenario:
    """A scenario from bench/scenarios, with some fields replaced (a scaled-down quick run)."""
    base = Scenario.load(SCENARIOS / f"{file}.yaml")
    return Scenario(**{**base.__dict__, **overrides})


def peer_jobs(suite: Suite, peer: Variant) -> tuple[FleetJob, ...]:
    """The suite's fleet scenarios in their ServiceEntry form, each for meshpilot and then the peer."""
    jobs = []
    for job in suite.fleet:
        scenario = job.scenario
        se = Scenario(**{**scenario.__dict__, "service_entries": True, "name": f"{scenario.name}-se"})
        jobs.append(replace(job, scenario=se, variants=(COMPILED, peer)))
    return tuple(jobs)


def suites() -> dict[str, Suite]:
    quick_http, full_http = _scenario("http", services=200, proxies=400, name="http-200"), _scenario("http")
    return {
        "quick": Suite(
            "quick",
            micro_min_time=0.1,
            fleet=(FleetJob(quick_http, (COMPILED, PURE, NO_CACHE), steady_seconds=5),),
            storm=(StormJob(_scenario("storm", proxies=1000, name="storm-1000")),),
            floor=_floors(quick_http),
            ca=CaJob(sign_count=100, workloads=500),
        ),
        "full": Suite(
            "full",
            micro_min_time=0.2,
            fleet=(
                FleetJob(full_http, (COMPILED, PURE, NO_CACHE)),
                FleetJob(_scenario("tcp"), (COMPILED,)),
                FleetJob(_scenario("scoped"), (COMPILED,)),
                FleetJob(_scenario("gateways"), (COMPILED,)),
                FleetJob(_scenario("eds-1"), (COMPILED, PURE)),
                FleetJob(_scenario("eds-100"), (COMPILED, PURE)),
                FleetJob(_scenario("eds-1000"), (COMPILED, PURE)),
            ),
            storm=(StormJob(_scenario("storm")),),
            floor=_floors(full_http),
            ca=CaJob(sign_count=300, workloads=2000),
        ),
    }


# -- helpers ---------------------------------------------------------------------------


def _histogram(metrics: dict[str, float], name: str) -> dict[str, float]:
    """Count and sum of a Prometheus histogram, over all label values."""
    count = sum(v for k, v in metrics.items() if k.startswith(name + "_count"))
    total = sum(v for k, v in metrics.items() if k.startswith(name + "_sum"))
    return {"count": count, "sum": total, "mean": total / count if count else 0.0}


def _counter(metrics: dict[str, float], name: str) -> dict[str, float]:
    out = {}
    for key, value in metrics.items():
        if key.startswith(name):
            label = key[len(name) :].replace("_total", "").strip("{}") or "all"
            out[label] = value
    return out


def _push_metrics(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """What the server reported for one change: pushes, skips, push and send times."""

    def delta(name: str, kind: Callable[[dict[str, float], str], dict[str, float]]) -> dict[str, float]:
        a, b = kind(before, name), kind(after, name)
        out = {k: round(v - a.get(k, 0.0), 6) for k, v in b.items() if k != "mean" and v != a.get(k)}
        if "count" in b:
            # A histogram: the mean of what this change observed, not a difference of means.
            count = b["count"] - a.get("count", 0.0)
            out["mean"] = round((b["sum"] - a.get("sum", 0.0)) / count, 6) if count else 0.0
        return out

    return {
        "pushes": delta("pilot_xds_pushes", _counter),
        "unchanged_skipped": delta("meshpilot_xds_unchanged_skipped", _counter),
        "push_time_seconds": delta("pilot_xds_push_time", _histogram),
        "send_time_seconds": delta("pilot_xds_send_time", _histogram),
        "queue_time_seconds": delta("pilot_proxy_queue_time", _histogram),
        "config_size_bytes": delta("pilot_xds_config_size_bytes", _histogram),
    }


# -- fleet runs ------------------------------------------------------------------------


def _change(
    server: ServerProcess,
    fleet: Fleet,
    marker: bytes,
    type_url: str,
    expected: int,
    write: Callable[[], None],
) -> dict[str, Any]:
    """Make a change and time, per proxy, from the write to the response that carries ``marker``."""
    fleet.arm(marker, type_url)
    before = server.metrics()
    cpu, fleet_cpu = server.cpu_seconds(), fleet.cpu_seconds()
    started = time.time()
    write()
    times = fleet.wait_marker(expected, 120)
    cpu, fleet_cpu = server.cpu_seconds() - cpu, fleet.cpu_seconds() - fleet_cpu
    seen = [t - started for t in times if t is not None]
    time.sleep(1)  # let the last ACKs and metrics land
    out: dict[str, Any] = {
        "proxies": expected,
        "converged": len(seen),
        "server_cpu_seconds": round(cpu, 3),
        # The simulator shares the machine's cores: with the server's CPU it bounds the wall time.
        "fleet_cpu_seconds": round(fleet_cpu, 3),
        "server": _push_metrics(before, server.metrics()),
    }
    if seen:
        first = min(seen)
        out["from_write_seconds"] = summary(seen)
        # From the first proxy's copy: the fan-out once the push has started.
        out["fan_out_seconds"] = summary([t - first for t in seen])
        out["first_seconds"] = first
        out["latencies_ms"] = sorted(round(t * 1000, 1) for t in seen)
    return out


#: How long the unchanged rewrite is watched: past istiod's 250 ms file-watch delay and its debounce.
REWRITE_WINDOW = 2.0


def _rewrite_unchanged(server: ServerProcess, config: Path, scenario: Scenario) -> dict[str, Any]:
    """Rewrite one config file with what it holds: the server's CPU for reading files, and any push."""
    before = server.metrics()
    cpu = server.cpu_seconds()
    write_yaml(config / "svc-0.yaml", scenario.service_objects(0))
    time.sleep(REWRITE_WINDOW)
    return {
        "window_seconds": REWRITE_WINDOW,
        "server_cpu_seconds": round(server.cpu_seconds() - cpu, 3),
        "server": _push_metrics(before, server.metrics()),
    }


def _short(type_url: str) -> str:
    return {EDS: "eds", RDS: "rds"}.get(type_url) or type_url.rsplit(".", 1)[-1].lower()


def _server(
    job: FleetJob, variant: Variant, config: Path, workdir: Path, kube: KubeStub | None
) -> ServerProcess:
    if variant.server == "istiod":
        if kube is None:
            raise ValueError("istiod needs the empty API server (bench.kube_stub)")
        return peer_istiod.IstiodProcess(
            config,
            workdir,
            kubeconfig=kube.kubeconfig,
            debounce=DEBOUNCE,
            connect_rate=job.connect_rate,
            env=variant.env,
        )
    args = ["--debounce-after", DEBOUNCE, *variant.args]
    if job.connect_rate is not None:
        args += ["--max-requests-per-second", str(job.connect_rate)]
    return ServerProcess(config, workdir, extra=args, env=variant.env)


def run_fleet(job: FleetJob, variant: Variant, workdir: Path, kube: KubeStub | None = None) -> dict[str, Any]:
    """One server on the scenario: initial sync, steady state, then an endpoint and a VirtualService change.

    ``kube`` is the empty API server istiod's kube client needs (``variant.server == "istiod"``).
    """
    scenario = job.scenario
    config = workdir / "config"
    scenario.write(config)
    server = _server(job, variant, config, workdir, kube)
    result: dict[str, Any] = {
        "scenario": scenario.name,
        "variant": variant.name,
        "server": variant.server,
        "connect_rate": job.connect_rate,
    }
    fleet: Fleet | None = None
    try:
        result["ready_seconds"] = round(server.start(), 3)
        result["rss_after_load_mib"] = round(server.memory()["rss_mib"], 1)
        cpu = server.cpu_seconds()
        fleet = Fleet(server.target, fleet_specs(scenario), scenario.route_names(), own_connections=True)
        fleet.start()
        result["sync_seconds"] = round(fleet.wait_synced(1200), 3)
        result["sync_server_cpu_seconds"] = round(server.cpu_seconds() - cpu, 3)
        status = fleet.status()
        result["sync_bytes_per_proxy"] = int(status["bytes"] / max(1, status["proxies"]))
        result["empty_configs"] = status["empty_configs"]
        # What one sidecar got: resources by type, and a digest of their names to compare servers by.
        first = status["resources"][0] if status["resources"] else {}
        result["resources_per_proxy"] = {_short(t): first[t] for t in TYPES if t in first}
        names = fleet.names()
        result["resource_names_digest"] = {
            _short(t): hashlib.sha256("\n".join(names[t]).encode()).hexdigest()[:16]
            for t in TYPES
            if t in names
        }
        time.sleep(job.settle_seconds)
        cpu = server.cpu_seconds()
        time.sleep(job.steady_seconds)
        result["steady_vcpu"] = round((server.cpu_seconds() - cpu) / job.steady_seconds, 4)
        memory = server.memory()
        result["steady_rss_mib"] = round(memory["rss_mib"], 1)
        if job.changes:
            result["unchanged_rewrite"] = _rewrite_unchanged(server, config, scenario)
            new_ip = scenario.endpoint_ip(0, scenario.endpoints_of(0))
            result["endpoint_added"] = _change(
                server,
                fleet,
                new_ip.encode(),
                EDS,
                scenario.proxies,
                lambda: write_yaml(config / "svc-0.yaml", scenario.service_objects(0, extra_endpoints=1)),
            )
            if scenario.protocol != "tcp" and scenario.virtual_services:
                result["virtual_service_changed"] = _change(
                    server,
                    fleet,
                    b"bench-change1",
                    RDS,
                    scenario.proxies,
                    lambda: write_yaml(
                        config / scenario.virtual_service_file(0),
                        [scenario.virtual_service(0, marker="change1")],
                    ),
                )
        result["peak_rss_mib"] = round(server.memory()["peak_rss_mib"], 1)
        status = fleet.status()
        result["streams_ended"] = status.get("ended", {})
        result["stream_end_samples"] = status["samples"]
        result["reconnects"] = status["connects"] - status["proxies"]
    finally:
        if fleet is not None:
            fleet.stop()
        result["exit_code"] = server.stop()
    return result


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
        "python": platform.python_version(),
        "platform": platform.platform(),
        "commit": commit,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def run_peer(suite: Suite, peer: Variant, only: set[str] | None) -> dict[str, Any]:
    """The suite's fleet scenarios, ServiceEntry form, meshpilot then the peer, one run each."""
    info = peer_istiod.version()
    out: dict[str, Any] = {
        "server": peer.name,
        "version": info,
        "binary": str(peer_istiod.binary().relative_to(ROOT)),
        "debounce": DEBOUNCE,
        "runs": [],
    }
    for job in peer_jobs(suite, peer):
        if only and not ({"peer", job.scenario.name, job.scenario.name.removesuffix("-se")} & only):
            continue
        for variant in job.variants:
            log(f"peer fleet {job.scenario.name} ({job.scenario.proxies} proxies), {variant.name}")
            # The stub runs beside both servers, though only istiod talks to it, so the machine
            # is the same for both (its CPU is recorded, and counted for neither).
            with (
                tempfile.TemporaryDirectory(prefix="meshpilot-bench-") as tmp,
                KubeStub(Path(tmp) / "kube") as kube,
            ):
                cpu = kube.cpu_seconds()
                result = run_fleet(job, variant, Path(tmp), kube)
                result["kube_stub_cpu_seconds"] = round(kube.cpu_seconds() - cpu, 3)
            out["runs"].append({"scenario_spec": asdict(job.scenario), **result})
            log(json.dumps({k: v for k, v in result.items() if not isinstance(v, dict)}))
    return out


def run_suite(suite: Suite, only: set[str] | None, peer: Variant | None = None) -> dict[str, Any]:
    results: dict[str, Any] = {"suite": suite.name, "machine": machine(), "fleet": [], "storm": []}
    started = time.time()
    if not only or "micro" in only:
        log("micro benchmarks, compiled")
        results["micro"] = {"compiled": run_micro(False, suite.micro_min_time)}
        log("micro benchmarks, pure Python")
        results["micro"]["pure-python"] = run_micro(True, suite.micro_min_time)
    if suite.floor and (not only or "floor" in only):
        results["grpc_floor"] = []
        for floor in suite.floor:
            log(f"gRPC floor, {floor.streams} streams, {floor.message_bytes} B out, {floor.ack_bytes} B ACKs")
            found = grpc_floor.run(floor.streams, floor.message_bytes, floor.ack_bytes, floor.rounds)
            results["grpc_floor"].append({"stands_for": floor.stands_for, **found})
            log(json.dumps(found["rounds"]))
    for job in suite.fleet:
        if only and job.scenario.name not in only and "fleet" not in only:
            continue
        for variant in job.variants:
            log(f"fleet {job.scenario.name} ({job.scenario.proxies} proxies), {variant.name}")
            with tempfile.TemporaryDirectory(prefix="meshpilot-bench-") as tmp:
                result = run_fleet(job, variant, Path(tmp))
            results["fleet"].append({"scenario_spec": asdict(job.scenario), **result})
            log(json.dumps({k: v for k, v in result.items() if not isinstance(v, dict)}))
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
    results["wall_seconds"] = round(time.time() - started, 1)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    parser.add_argument("--suite", choices=sorted(suites()), default="quick")
    parser.add_argument("--only", nargs="*", help="micro, floor, fleet, peer, storm, ca or scenario names")
    parser.add_argument(
        "--peer",
        choices=sorted(PEERS),
        help="also run the fleet scenarios, ServiceEntry form, on this server and on meshpilot, side by side",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--no-report", action="store_true", help="do not rewrite docs/benchmarks.md")
    args = parser.parse_args(argv)
    suite = suites()[args.suite]
    peer = PEERS[args.peer] if args.peer else None
    if peer is not None:
        try:
            peer_istiod.binary()
        except peer_istiod.MissingReference as err:
            parser.error(str(err))
    results = run_suite(suite, set(args.only) if args.only else None, peer)
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
