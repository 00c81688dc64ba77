"""The delta xDS parts of docs/benchmarks.md: both protocols side by side, and a push against the floor.

The suite runs some fleet scenarios twice, once with state-of-the-world
sidecars and once with delta ones (``bench.fleet_run.FleetJob.delta``), and the
bare-gRPC floor at the bytes each protocol's pushes measured. These sections
put the two runs of a scenario in columns, and each push's server CPU next
to the floor's for the same bytes, streams and ACKs.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from bench.measure import DEBOUNCE_SECONDS
from bench.tables import counts, fleet_run, get, goal_row, memory_goal_rows, ratio, table

CHANGES = (("endpoint_added", "endpoint added"), ("virtual_service_changed", "VirtualService changed"))
#: The issue's goal for a push's server CPU over the floor's for the same bytes.
FLOOR_RATIO_GOAL = 1.5
#: The latency goals, both protocols: (change, the goal in words, seconds the goal leaves out of the
#: p99 from the write, target seconds).
LATENCY_GOALS = (
    ("endpoint_added", "Endpoint added: p99 after the debounce", DEBOUNCE_SECONDS, 0.3),
    ("virtual_service_changed", "VirtualService changed: p99 from the write", 0.0, 1.0),
)


def _pairs(results: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """Compiled runs by scenario, then protocol, for scenarios run over both protocols."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for run in results.get("fleet") or []:
        if run["variant"] == "compiled":
            out.setdefault(run["scenario"], {}).setdefault(run.get("protocol", "sotw"), run)
    return {name: pair for name, pair in out.items() if {"sotw", "delta"} <= set(pair)}


def _floor_for(results: dict[str, Any], scenario: str, change: str, protocol: str) -> dict[str, Any] | None:
    for floor in results.get("grpc_floor") or []:
        if (floor.get("scenario"), floor.get("change"), floor.get("protocol", "sotw")) == (
            scenario,
            change,
            protocol,
        ):
            return dict(floor)
    return None


def floor_cpu(floor: dict[str, Any]) -> float | None:
    """The floor's server CPU for one round: the median of its rounds."""
    values = [r["server_cpu_seconds"] for r in floor.get("rounds") or [] if r.get("acks") == r.get("streams")]
    return statistics.median(values) if values else None


def push_vs_floor(results: dict[str, Any]) -> list[dict[str, Any]]:
    """For each push the floor ran for: meshpilot's server CPU, the floor's, and their ratio."""
    out = []
    for floor in results.get("grpc_floor") or []:
        scenario, change, protocol = floor.get("scenario"), floor.get("change"), floor.get("protocol", "sotw")
        if not scenario or not change:
            continue  # a floor from before the floor named its push
        run = fleet_run(results, scenario, protocol=protocol)
        ours = get(run or {}, change, "server_cpu_seconds")
        theirs = floor_cpu(floor)
        rewrite = get(run or {}, "unchanged_rewrite", "server_cpu_seconds")
        out.append(
            {
                "push": floor.get("stands_for", change),
                "scenario": run["scenario"] if run else scenario,
                "protocol": protocol,
                "sized_from": floor.get("sized_from", "estimate"),
                "streams": floor.get("streams"),
                "message_bytes": floor.get("message_bytes"),
                "ack_bytes": floor.get("ack_bytes"),
                "meshpilot_cpu": ours,
                "rounds_cpu": [r["server_cpu_seconds"] for r in get(run or {}, change, "rounds") or []],
                "meshpilot_less_rewrite": (
                    None if ours is None or rewrite is None else max(0.0, ours - rewrite)
                ),
                "floor_cpu": theirs,
                "ratio": ours / theirs if isinstance(ours, int | float) and theirs else None,
            }
        )
    return out


# -- goals -----------------------------------------------------------------------------


def latency_goal_rows(run: dict[str, Any], scale: str) -> list[list[Any]]:
    """The latency goals' rows for one fleet run."""
    rows = []
    for change, words, left_out, target in LATENCY_GOALS:
        p99 = get(run, change, "from_write_seconds", "p99")
        rows.append(goal_row(f"{words} ({scale})", target, None if p99 is None else p99 - left_out, "s"))
    return rows


def goals(results: dict[str, Any]) -> list[list[Any]]:
    """The delta goals of issue 17, on the http scenario's delta run and the floor."""
    http = fleet_run(results, "http", protocol="delta")
    if http is None:
        return []
    spec = http["scenario_spec"]
    scale = f"delta, {spec['proxies']} sidecars, {spec['services']} services"
    rows = [
        *latency_goal_rows(http, scale),
        # What a stock sidecar speaks; its first requests after a reconnect name all it holds, so its
        # memory is judged apart from state-of-the-world's.
        *memory_goal_rows(http, scale),
    ]
    for row in push_vs_floor(results):
        if row["protocol"] == "delta":
            rows.append(
                goal_row(
                    f"{row['push']}: server CPU over the bare-gRPC floor's for the same bytes ({scale})",
                    FLOOR_RATIO_GOAL,
                    row["ratio"],
                    "x",
                )
            )
    return rows


def latency_bounds(results: dict[str, Any]) -> list[str]:
    """An estimate of the least p99 the latency goals could show on this machine for a server that
    reaches its first proxy when meshpilot did and then costs only the bare-gRPC floor: the simulator
    shares the cores, so the push cannot end before the floor's and the simulator's CPU (as measured
    with meshpilot) have run on them. It counts every write and ACK, so it bounds the last proxy's copy
    rather than the p99; a server of another make (istiod is Go, the floor Python's grpc.aio) has
    another floor."""
    http = fleet_run(results, "http", protocol="delta")
    if http is None:
        return []
    cores = (results.get("machine") or {}).get("cpus") or 1
    parts = []
    for change, words, left_out, target in LATENCY_GOALS:
        floor = _floor_for(results, http["scenario"], change, "delta")
        floor_server = floor_cpu(floor) if floor else None
        first = get(http, change, "first_seconds")
        simulator = get(http, change, "fleet_cpu_seconds")
        if floor_server is None or first is None or simulator is None:
            continue
        least = first - left_out + (floor_server + simulator) / cores
        parts.append(
            f"{words}: {least:.2f} s (goal {target:g} s; {first:.2f} s to the first copy, then "
            f"({floor_server:.2f} s floor + {simulator:.2f} s simulator) / {cores} cores)"
        )
    if not parts:
        return []
    return [
        "About the least p99 a Python server could measure here that reached its first proxy when "
        "meshpilot did and then cost only the bare-gRPC floor (delta, http): "
        + "; ".join(parts)
        + ". The simulator shares the cores, so such a server cannot do better on this machine; a goal "
        "below this figure is out of reach here for any server built on grpc.aio.",
        "",
    ]


# -- sections --------------------------------------------------------------------------


def _rows(sotw: dict[str, Any], delta: dict[str, Any]) -> list[list[Any]]:
    """(measure, state-of-the-world, delta, delta / sotw) for one scenario's two runs."""
    rows: list[list[Any]] = []

    def row(label: str, *path: str) -> None:
        a, b = get(sotw, *path), get(delta, *path)
        rows.append([label, a, b, ratio(b, a)])

    def text(label: str, render: Any, *path: str) -> None:
        rows.append([label, render(get(sotw, *path)), render(get(delta, *path)), "-"])

    row("initial sync of every sidecar, s", "sync_seconds")
    row("server CPU during the sync, s", "sync_server_cpu_seconds")
    row("bytes per sidecar at sync", "sync_bytes_per_proxy")
    text("resources of one sidecar", lambda v: _plain(v) if v else "-", "resources_per_proxy")
    same = sotw.get("resource_names_digest") == delta.get("resource_names_digest")
    rows.append(["same resource names over both", "-", "yes" if same else "**no**", "-"])
    row("steady CPU, vCPU", "steady_vcpu")
    row("steady RSS, MiB", "steady_rss_mib")
    row("peak RSS, MiB", "peak_rss_mib")
    for change, label in CHANGES:
        if change not in sotw and change not in delta:
            continue
        text(f"{label}: proxies converged", _converged, change)
        row(f"{label}: from write p50, s", change, "from_write_seconds", "p50")
        row(f"{label}: from write p99, s", change, "from_write_seconds", "p99")
        row(f"{label}: fan-out p99, s", change, "fan_out_seconds", "p99")
        row(f"{label}: server CPU, s", change, "server_cpu_seconds")
        row(f"{label}: simulator CPU, s", change, "fleet_cpu_seconds")
        row(f"{label}: bytes received per proxy", change, "bytes_per_proxy")
        row(f"{label}: bytes sent per proxy (ACKs, subscriptions)", change, "sent_bytes_per_proxy")
        text(f"{label}: resources received per proxy", _resources, change, "resources_received_per_proxy")
        text(f"{label}: responses sent", counts, change, "server", "pushes")
    if "reconnect" in sotw or "reconnect" in delta:
        row("every stream dropped: all synced again, s", "reconnect", "synced_seconds")
        row("every stream dropped: server CPU, s", "reconnect", "server_cpu_seconds")
        row("every stream dropped: bytes received per proxy", "reconnect", "bytes_per_proxy")
        text(
            "every stream dropped: resources received per proxy",
            _resources,
            "reconnect",
            "resources_received_per_proxy",
        )
    return rows


def _resources(counts: dict[str, float] | None) -> str:
    """Counted by delta sidecars only ('-' for state-of-the-world); 'none' when nothing came."""
    if counts is None:
        return "-"
    return _plain(counts) if counts else "none"


def _converged(change: dict[str, Any] | None) -> str:
    return "-" if not change else f"{change['converged']}/{change['proxies']}"


def _plain(values: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in values.items())


def protocol_section(results: dict[str, Any]) -> list[str]:
    """Each scenario run over both protocols, in two columns and their ratio."""
    pairs = _pairs(results)
    if not pairs:
        return []
    out = ["### Delta xDS beside state-of-the-world", ""]
    out.append(
        "The same scenario, server build and machine, one run after the other: the simulated sidecars "
        "speak state-of-the-world ADS (StreamAggregatedResources) in the first and delta xDS "
        "(DeltaAggregatedResources) in the second, as Envoy does over each (`bench/fleet_delta.py`: "
        "CDS and LDS as wildcards, EDS and RDS subscribed by name, ACKs with the nonce alone, "
        "removals applied, and on a new stream the versions held sent as "
        "`initial_resource_versions`). A state-of-the-world ACK names every resource asked for again "
        "(an EDS ACK every cluster); a delta ACK is the type and the nonce. 'Every stream dropped' "
        "closes all streams after the changes and lets each proxy open a new one at the server's "
        "stream rate: a delta proxy says what it holds, so a server can send only what changed. The "
        "last column is delta's figure over state-of-the-world's: below 1 is less."
    )
    out.append("")
    for name, pair in pairs.items():
        sotw, delta = pair["sotw"], pair["delta"]
        spec = sotw["scenario_spec"]
        rules = spec.get("destination_rules", 0)
        out += [
            f"**{name}**: {spec['services']} services x {spec['endpoints_per_service']} endpoints, "
            f"{spec['proxies']} sidecars, {spec['virtual_services']} VirtualService(s), "
            f"{rules} DestinationRule(s)",
            "",
        ]
        out += table(["measure", "state-of-the-world", "delta", "delta / sotw"], _rows(sotw, delta))
    return out


def push_floor_section(results: dict[str, Any], image: str | None = None) -> list[str]:
    """meshpilot's server CPU for a push next to the bare-gRPC floor's for the same bytes."""
    rows = push_vs_floor(results)
    if not rows:
        return []
    out = ["### A push against the floor", ""]
    out.append(
        "meshpilot's server CPU for each push of the fleet runs, next to the floor's (bare grpc.aio, "
        "nothing generated; the median of its rounds) for a message and ACK of the bytes the simulator "
        "measured per proxy in that push, to as many streams. The push's CPU runs from the config write "
        "to the last proxy's copy, so it includes reading the file; the column less the unchanged "
        "rewrite's takes that out, roughly (two readings in 10 ms ticks). Where a change was made more "
        "than once, meshpilot's figures are its round of median CPU, and every round's CPU is beside "
        "them, in the order made. The issue's goal is at most "
        f"{FLOOR_RATIO_GOAL:g} times the floor over delta."
    )
    out.append("")
    out += table(
        [
            "push",
            "scenario",
            "protocol",
            "sized from",
            "streams",
            "bytes out per proxy",
            "ACK bytes per proxy",
            "meshpilot CPU s",
            "each round's CPU s",
            "less the rewrite's s",
            "floor CPU s",
            "meshpilot / floor",
        ],
        [
            [
                r["push"],
                r["scenario"],
                r["protocol"],
                r["sized_from"],
                r["streams"],
                r["message_bytes"],
                r["ack_bytes"],
                r["meshpilot_cpu"],
                ", ".join(f"{c:.2f}" for c in r["rounds_cpu"]) or "-",
                r["meshpilot_less_rewrite"],
                r["floor_cpu"],
                f"{r['ratio']:.2f}x" if r["ratio"] is not None else "-",
            ]
            for r in rows
        ],
    )
    if image:
        out += [f"![push against the floor]({image})", ""]
    return out


def push_floor_plot(results: dict[str, Any], path: Path) -> bool:
    """Bars of meshpilot's and the floor's server CPU per push and protocol; False if nothing to draw."""
    rows = [r for r in push_vs_floor(results) if r["meshpilot_cpu"] is not None and r["floor_cpu"]]
    if not rows:
        return False
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    width = 0.38
    xs = range(len(rows))
    ax.bar([x - width / 2 for x in xs], [r["meshpilot_cpu"] for r in rows], width, label="meshpilot")
    ax.bar([x + width / 2 for x in xs], [r["floor_cpu"] for r in rows], width, label="bare gRPC floor")
    labels = [f"{r['push'].split(' (')[0]}\n{r['protocol']}" for r in rows]
    ax.set_xticks(list(xs), labels, fontsize=7)
    ax.set_ylabel("server CPU seconds per push")
    ax.set_title("A push's server CPU against the floor for the same bytes")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
