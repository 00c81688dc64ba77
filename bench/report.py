"""docs/benchmarks.md and its plots, from bench/results/*.json (``python -m bench.report``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench import bulk_config, pool_bench, report_delta, report_fleet, report_micro
from bench import ca as ca_bench
from bench.report_peer import peer_section
from bench.tables import fleet_run, fmt, get, goal_row, memory_goal_rows, table

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
IMAGES = ROOT / "docs" / "img" / "benchmarks"
#: The hand-written analysis, appended as it is.
NOTES = ROOT / "bench" / "notes.md"
#: The name's end of the plot of a push's CPU against the floor's (report_delta).
PUSH_FLOOR_IMAGE = "-push-floor.png"


def storms_apart(results: dict[str, Any]) -> list[str]:
    """A line under the goals when the storms were merged from a run of their own (``--only storm``)."""
    apart = sorted({s["commit"] for s in report_fleet.storms_run_apart(results)})
    if not apart:
        return []
    return [f"The reconnect storms' rows are from commit {', '.join(apart)} (see 'Reconnect storms').", ""]


def goals(results: dict[str, Any]) -> list[list[Any]]:
    """(goal, target, measured, verdict) rows for the issue's goals."""
    rows = report_micro.goals(results)

    def row(
        goal: str, target: float, measured: float | None, unit: str, higher_is_better: bool = False
    ) -> None:
        rows.append(goal_row(goal, target, measured, unit, higher_is_better))

    http = fleet_run(results, "http")
    if http is not None:
        scale = f"{http['scenario_spec']['proxies']} sidecars, {http['scenario_spec']['services']} services"
        row(f"Steady-state CPU ({scale})", 0.5, http.get("steady_vcpu"), "vCPU")
        rows.extend(memory_goal_rows(http, scale))
        rows += report_delta.latency_goal_rows(http, scale)
        fan_out = get(http, "endpoint_added", "fan_out_seconds", "p99")
        row(f"Endpoint added: p99 fan-out ({scale})", 0.3, fan_out, "s")
    for storm in results.get("storm", []):
        for phase in ("streams_dropped", "server_restarted"):
            data = storm.get(phase) or {}
            label = f"{storm['proxies']} streams reconnecting ({phase.replace('_', ' ')})"
            row(f"{label}: /ready p99 latency", 0.1, get(data, "ready_latency_seconds", "p99"), "s")
            row(f"{label}: /ready max latency", 0.1, get(data, "ready_latency_seconds", "max"), "s")
            row(f"{label}: proxies served empty config", 0, data.get("empty_configs"), "")
    return rows


# -- sections --------------------------------------------------------------------------


# -- plots -----------------------------------------------------------------------------


def plots(results: dict[str, Any], suite: str) -> list[str]:
    """PNG files for the suite; paths relative to docs/."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots (pip install '.[bench]')", file=sys.stderr)
        return []
    IMAGES.mkdir(parents=True, exist_ok=True)
    made = []
    eds = get(results, "micro", "compiled", "eds_encoding") or []
    if eds:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        labels = [str(e["endpoints"]) for e in eds]
        width = 0.27
        for i, (key, name) in enumerate(
            [
                ("protobuf_us", "protobuf objects"),
                ("twin_us", "pure-Python twin"),
                ("compiled_us", "compiled"),
            ]
        ):
            ax.bar([x + (i - 1) * width for x in range(len(eds))], [e[key] for e in eds], width, label=name)
        ax.set_xticks(range(len(eds)), labels)
        ax.set_yscale("log")
        ax.set_xlabel("endpoints per ClusterLoadAssignment")
        ax.set_ylabel("µs per endpoint (log)")
        ax.set_title("EDS encoding")
        ax.legend()
        fig.tight_layout()
        path = IMAGES / f"{suite}-eds-encoding.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(str(path.relative_to(DOC.parent)))
    for change, title in (
        ("endpoint_added", "One endpoint added"),
        ("virtual_service_changed", "One VirtualService changed"),
    ):
        runs = [*results.get("fleet", []), *(get(results, "peer", "runs") or [])]
        curves = [
            (
                f"{r['scenario']} · {r['variant']} · {r.get('protocol', 'sotw')}",
                get(r, change, "latencies_ms"),
            )
            for r in runs
            if get(r, change, "latencies_ms")
        ]
        if not curves:
            continue
        fig, ax = plt.subplots(figsize=(6.5, 3.8))
        for label, latencies in curves:
            n = len(latencies)
            ax.plot([v / 1000 for v in latencies], [(i + 1) / n for i in range(n)], label=label)
        ax.set_xlabel("seconds from the config write until the proxy has it")
        ax.set_ylabel("fraction of proxies")
        ax.set_title(f"{title}: convergence")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = IMAGES / f"{suite}-{change.replace('_', '-')}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(str(path.relative_to(DOC.parent)))
    path = IMAGES / f"{suite}{PUSH_FLOOR_IMAGE}"
    if report_delta.push_floor_plot(results, path):
        made.append(str(path.relative_to(DOC.parent)))
    return made


# -- the document ----------------------------------------------------------------------


def render(all_results: dict[str, dict[str, Any]]) -> str:
    out = [
        "# Benchmarks",
        "",
        "Generated by `make bench` (the full suite) or `make bench-quick` (a scaled-down run in under five "
        "minutes) from `bench/results/<suite>.json`; rerun either to refresh this page. Every figure is "
        "measured in the same run as its reference. The scenarios are in `bench/scenarios/`, the fleet "
        "simulator in `bench/fleet.py` and the suites in `bench/run.py`. Every server but the push-worker "
        'pool\'s ("The push-worker pool") runs as one process (`--push-workers 1`): these are one '
        "core's figures, while `meshpilot discovery` by default starts a worker per usable core.",
        "",
    ]
    for suite in ("full", "quick"):
        results = all_results.get(suite)
        if results is None:
            continue
        machine = results.get("machine", {})
        out += [f"## The {suite} suite", ""]
        commit, date, cpus = machine.get("commit", "?"), machine.get("date", "?"), machine.get("cpus", "?")
        out.append(
            f"Commit {commit}, {date}; {cpus} CPUs, Python {machine.get('python', '?')}; "
            f"{results.get('wall_seconds', '?')} s in all. The simulator runs on the same CPUs as the server."
            + allocator_sentence(machine)
        )
        out += host_speed_line(machine)
        out.append("")
        out += ["### Goals", ""]
        out += storms_apart(results)
        out += table(
            ["goal", "target", "measured", "verdict"],
            goals(results)
            + report_delta.goals(results)
            + ca_bench.goals(results)
            + pool_bench.goals(results),
        )
        out += report_delta.latency_bounds(results)
        out += report_micro.section(results)
        images = plots(results, suite)
        floor_image = next((i for i in images if i.endswith(PUSH_FLOOR_IMAGE)), None)
        out += report_fleet.fleet_section(results, [i for i in images if i != floor_image])
        out += report_delta.protocol_section(results)
        out += peer_section(results)
        out += report_fleet.floor_section(results)
        out += report_delta.push_floor_section(results, floor_image)
        out += report_fleet.storm_section(results)
        out += pool_bench.section(results)
        out += ca_bench.section(results)
        out += bulk_config.section(results)
    kube = all_results.get("kube")
    if kube is not None:
        out += kube_section(kube)
    if NOTES.exists():
        out += ["", NOTES.read_text().strip(), ""]
    return "\n".join(out).rstrip() + "\n"


def kube_section(kube: dict[str, Any]) -> list[str]:
    """``bench/results/kube.json`` from ``python -m bench.kube_sync``."""
    machine = kube.get("machine", {})
    out = [
        "## Listing and indexing a cluster from the Kubernetes API",
        "",
        f"`python -m bench.kube_sync`, commit {machine.get('commit', '?')}, {machine.get('date', '?')}; "
        f"{machine.get('cpus', '?')} CPUs. An emulated API server in a child process holds "
        f"{kube.get('pods', '?')} pods, {kube.get('services_requested', '?')} services and one "
        "EndpointSlice per service; meshpilot's startup path lists, decodes, indexes and builds its first "
        "snapshot. The raw list is the official client fetching and parsing the pods alone, the floor for "
        "any client of this server.",
        "",
    ]
    rows = [
        ["raw list of the pods (HTTP + JSON)", f"{fmt(kube.get('raw_pod_list_seconds'))} s"],
        ["every informer synced", f"{fmt(kube.get('synced_seconds'))} s"],
        ["ready (first snapshot built)", f"{fmt(kube.get('ready_seconds'))} s"],
        [
            "services / endpoints indexed",
            f"{kube.get('services', '?')} / {kube.get('endpoints_indexed', '?')}",
        ],
        [
            "RSS before → after",
            f"{fmt(kube.get('rss_before_mib'), 1)} → {fmt(kube.get('rss_after_mib'), 1)} MiB",
        ],
        ["RSS growth (the cluster held)", f"{fmt(kube.get('rss_growth_mib'), 1)} MiB"],
        ["peak RSS", f"{fmt(kube.get('peak_rss_mib'), 1)} MiB"],
    ]
    out += table(["measure", "value"], rows)
    return out


def allocator_sentence(machine: dict[str, Any]) -> str:
    """Which memory allocator meshpilot's servers ran on, when it was recorded: it moves the large pushes."""
    chosen = machine.get("server_allocator")
    return f" meshpilot's memory allocator: {chosen}." if chosen else ""


def host_speed_line(machine: dict[str, Any]) -> list[str]:
    """How fast one core was around the run (`bench.measure.host_speed`), when it was recorded."""
    speed = machine.get("host_speed_seconds")
    if not speed:
        return []
    return [
        "",
        f"Host speed: ten million additions in a bare Python loop took {speed['before']} s before the "
        f"run and {speed['after']} s after it (`bench.measure.host_speed`: a rough guide to how busy the "
        "host was, not a factor to scale figures by). It covers the sections measured in this run, not "
        "those merged in from earlier runs.",
    ]


def write_report(results_dir: Path = ROOT / "bench" / "results") -> Path:
    all_results = {}
    for suite in ("full", "quick", "kube"):
        path = results_dir / f"{suite}.json"
        if path.exists():
            all_results[suite] = json.loads(path.read_text())
    DOC.write_text(render(all_results))
    return DOC


if __name__ == "__main__":
    print(write_report())
