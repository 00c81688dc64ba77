"""One fleet run: a server on a scenario, the simulated sidecars over one protocol, and what each change cost.

``run_fleet`` starts a real server process (meshpilot, or istiod for the peer
runs) on the scenario's config directory, connects the fleet (``bench.fleet``,
state-of-the-world or delta), times the initial sync and the steady state,
then makes an endpoint change and a VirtualService change and times, per
proxy, the arrival of each; optionally it drops every stream and measures the
resync. ``bench.run`` puts runs together into suites.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from bench import istiod as peer_istiod
from bench.fleet import Fleet
from bench.kube_stub import KubeStub
from bench.measure import DEBOUNCE, fleet_specs, latency_figures
from bench.scenario import Scenario, write_yaml
from bench.server import ServerProcess
from bench.sidecar import EDS, RDS, TYPES
from bench.tables import get


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


@dataclass(frozen=True)
class FleetJob:
    scenario: Scenario
    #: Servers run with state-of-the-world sidecars.
    variants: tuple[Variant, ...]
    #: Servers also run with delta xDS sidecars, each right after its state-of-the-world run.
    delta: tuple[Variant, ...] = ()
    #: New streams per second while the fleet connects; None keeps istiod's default.
    connect_rate: int | None = 100
    steady_seconds: float = 10.0
    changes: bool = True
    #: Wait after the initial sync before the steady state is measured.
    settle_seconds: float = 2.0
    #: After the changes, drop every stream and time the resync (what a reconnect is sent again).
    reconnect: bool = False
    #: Each change is made this many times, the two kinds in turn; a change's figures are those of
    #: its round of median server CPU, with every round's CPU and p99 beside them (``median_round``):
    #: one push's CPU on this machine has varied by up to half from one run to the next.
    rounds: int = 1

    def runs(self) -> list[tuple[Variant, str]]:
        """(server, protocol) in the order they run: a variant's delta run right after its sotw run,
        so the two protocols are measured minutes apart, not a suite apart."""
        out = []
        for variant in self.variants:
            out.append((variant, "sotw"))
            if variant in self.delta:
                out.append((variant, "delta"))
        out += [(variant, "delta") for variant in self.delta if variant not in self.variants]
        return out


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
    traffic = fleet.status()
    cpu, fleet_cpu = server.cpu_seconds(), fleet.cpu_seconds()
    started = time.time()
    write()
    times = fleet.wait_marker(expected, 120)
    cpu, fleet_cpu = server.cpu_seconds() - cpu, fleet.cpu_seconds() - fleet_cpu
    seen = [t - started for t in times if t is not None]
    time.sleep(1)  # let the last ACKs and metrics land
    after = fleet.status()
    out: dict[str, Any] = {
        "proxies": expected,
        "converged": len(seen),
        "server_cpu_seconds": round(cpu, 3),
        # The simulator shares the machine's cores: with the server's CPU it bounds the wall time.
        "fleet_cpu_seconds": round(fleet_cpu, 3),
        "server": _push_metrics(before, server.metrics()),
        # What the push put on the wire, per proxy, each way: the floor runs at these sizes.
        "bytes_per_proxy": round((after["bytes"] - traffic["bytes"]) / max(1, expected)),
        "sent_bytes_per_proxy": round((after["bytes_sent"] - traffic["bytes_sent"]) / max(1, expected)),
    }
    if fleet.protocol == "delta":
        out["resources_received_per_proxy"] = _per_proxy(after, traffic, expected)
    out.update(latency_figures(seen))
    if seen:
        out["first_seconds"] = min(seen)
        out["latencies_ms"] = sorted(round(t * 1000, 1) for t in seen)
    return out


def median_round(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """A change's figures: its round of median server CPU (the lower of the middle two of an even
    count) among the rounds every proxy converged in (among all when none did; its ``converged`` says
    so), with each round's CPU, p99 and convergence (in the order made) under ``rounds``. The p99 is
    that round's, not the median of the rounds' p99s."""
    whole = [r for r in rounds if r["converged"] == r["proxies"]] or rounds
    chosen = dict(sorted(whole, key=lambda r: r["server_cpu_seconds"])[(len(whole) - 1) // 2])
    chosen["rounds"] = [
        {
            "server_cpu_seconds": r["server_cpu_seconds"],
            "from_write_p99": get(r, "from_write_seconds", "p99"),
            "fan_out_p99": get(r, "fan_out_seconds", "p99"),
            "converged": r["converged"],
        }
        for r in rounds
    ]
    return chosen


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


def _per_proxy(after: dict[str, Any], before: dict[str, Any], proxies: int) -> dict[str, float]:
    """Resources a delta fleet received between two statuses, per proxy, for each type it got any of."""
    now, then = after.get("received", {}), before.get("received", {})
    grew = {t: n - then.get(t, 0) for t, n in now.items() if n != then.get(t, 0)}
    return {_short(t): round(n / max(1, proxies), 2) for t, n in grew.items()}


def _reconnect(server: ServerProcess, fleet: Fleet, expected: int) -> dict[str, Any]:
    """Drop every stream and let each proxy open a new one: what the server sends again, and its CPU.

    A delta proxy sends the versions it holds (``initial_resource_versions``), so a server can send
    only what changed; a state-of-the-world proxy gets everything again. The new streams come in at
    the server's stream rate. The resync ends when every proxy is synced on a new stream and none
    has received anything for a second.
    """
    before = fleet.status()
    cpu = server.cpu_seconds()
    started = time.time()
    fleet.restart()
    synced = fleet.wait_synced(600, since=started)
    quiet = fleet.wait_quiet(1.0, 600)
    after = fleet.status()
    return {
        "proxies": expected,
        "synced_seconds": round(synced, 3),
        "quiet_after_seconds": round(synced + quiet, 3),
        "server_cpu_seconds": round(server.cpu_seconds() - cpu, 3),
        "bytes_per_proxy": round((after["bytes"] - before["bytes"]) / max(1, expected)),
        "sent_bytes_per_proxy": round((after["bytes_sent"] - before["bytes_sent"]) / max(1, expected)),
        **(
            {"resources_received_per_proxy": _per_proxy(after, before, expected)}
            if fleet.protocol == "delta"
            else {}
        ),
        "streams_opened": after["connects"] - before["connects"],
        "wall_seconds": round(time.time() - started, 3),
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


def run_fleet(
    job: FleetJob,
    variant: Variant,
    workdir: Path,
    kube: KubeStub | None = None,
    protocol: str = "sotw",
    after_round: Callable[[str, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """One server on the scenario: initial sync, steady state, then an endpoint and a VirtualService change.

    ``kube`` is the empty API server istiod's kube client needs (``variant.server == "istiod"``).
    ``protocol`` is what the simulated sidecars speak: "sotw" or "delta". ``after_round`` is called
    after each round of a change with the change's name and what the round measured, while the
    fleet waits (a suite measures the floor's round for that push there).
    """
    scenario = job.scenario
    config = workdir / "config"
    scenario.write(config)
    server = _server(job, variant, config, workdir, kube)
    result: dict[str, Any] = {
        "scenario": scenario.name,
        "variant": variant.name,
        "server": variant.server,
        "protocol": protocol,
        "connect_rate": job.connect_rate,
    }
    fleet: Fleet | None = None
    try:
        result["ready_seconds"] = round(server.start(), 3)
        result["rss_after_load_mib"] = round(server.memory()["rss_mib"], 1)
        cpu = server.cpu_seconds()
        fleet = Fleet(
            server.target,
            fleet_specs(scenario),
            scenario.route_names(),
            own_connections=True,
            protocol=protocol,
        )
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
            # Both changes are to service 0: a scoped proxy of another namespace never sees them
            # (waiting for it would wait out wait_marker's two minutes, as runs before this did).
            watchers = scenario.proxies_seeing(0)
            made: dict[str, list[dict[str, Any]]] = {"endpoint_added": [], "virtual_service_changed": []}

            def made_round(change: str, measured: dict[str, Any]) -> None:
                made[change].append(measured)
                if after_round is not None:
                    after_round(change, measured)

            for n in range(1, job.rounds + 1):
                # An endpoint more each round, and a new marker in the route: both reach every proxy.
                new_ip = scenario.endpoint_ip(0, scenario.endpoints_of(0) + n - 1)
                endpoints = scenario.service_objects(0, extra_endpoints=n)
                made_round(
                    "endpoint_added",
                    _change(
                        server,
                        fleet,
                        new_ip.encode(),
                        EDS,
                        watchers,
                        partial(write_yaml, config / "svc-0.yaml", endpoints),
                    ),
                )
                if scenario.protocol != "tcp" and scenario.virtual_services:
                    route = [scenario.virtual_service(0, marker=f"change{n}")]
                    made_round(
                        "virtual_service_changed",
                        _change(
                            server,
                            fleet,
                            f"bench-change{n}".encode(),
                            RDS,
                            watchers,
                            partial(write_yaml, config / scenario.virtual_service_file(0), route),
                        ),
                    )
            result.update({change: median_round(rounds) for change, rounds in made.items() if rounds})
        if job.reconnect:
            result["reconnect"] = _reconnect(server, fleet, scenario.proxies)
        result["peak_rss_mib"] = round(server.memory()["peak_rss_mib"], 1)
        status = fleet.status()
        result["streams_ended"] = status.get("ended", {})
        result["stream_end_samples"] = status["samples"]
        # Streams opened again by the simulator's own choice: not the reconnect it was told to make.
        dropped = scenario.proxies if job.reconnect else 0
        result["reconnects"] = status["connects"] - status["proxies"] - dropped
    finally:
        try:
            if fleet is not None:
                fleet.stop()
        finally:
            # Also when the fleet's workers died: a server left running holds its ports and a core.
            result["exit_code"] = server.stop()
    return result
