"""The fleet runs' part of docs/benchmarks.md: push and sync figures per scenario, the reconnect
storms, and the bare-gRPC floor they are read against (``bench/fleet_run.py``, ``bench/storm.py``,
``bench/grpc_floor.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.measure import DEBOUNCE_SECONDS
from bench.tables import get, table


def fleet_section(results: dict[str, Any], images: list[str]) -> list[str]:
    runs = results.get("fleet") or []
    if not runs:
        return []
    rate = runs[0].get("connect_rate") or "istiod's default number of"
    out = ["### Simulated fleets", ""]
    out.append(
        "A real `meshpilot discovery` process on the scenario's config directory; the simulator's "
        "sidecars (separate processes, real ADS streams, each on its own connection as an Envoy's is, "
        f"every response ACKed) connect at {rate} new streams/s (`--max-requests-per-second`). "
        "Changes are file writes: 'from write' includes the file watch (about 50 ms), reading the "
        f"file and the {DEBOUNCE_SECONDS * 1000:g} ms debounce; 'fan-out' is measured from the first "
        "proxy's copy, so it shows "
        "the push itself. Server CPU is user+system time from /proc, and sim CPU the simulator's over "
        "the same span: both share this machine's cores, so their sum over the core count is the least "
        "wall time the change could take here. RSS is resident memory (peak: VmHWM, over the whole run). "
        "The protocol column says whether the sidecars spoke state-of-the-world (`sotw`, "
        "StreamAggregatedResources) or delta xDS (`delta`, DeltaAggregatedResources, as a stock Istio "
        "sidecar does since 1.22). The http, tcp and scoped scenarios have no DestinationRules, so "
        "every outbound cluster comes from one template: that is the best case for CDS. http-dr is "
        "the http shape with a DestinationRule per service (two subsets and a traffic policy), "
        "which is closer to a mesh that configures its services; the rules have a few distinct "
        "policies among them (`rule_policies`). Since commit 92d40be clusters of equal policies "
        "share a CDS template; templates are built only when a cluster is (the XdsCache keeps "
        "clusters), so the fleet figures barely move with it (bench/notes.md)."
    )
    out.append("")
    rows = []
    for run in runs:
        spec = run["scenario_spec"]
        eds, vs = run.get("endpoint_added") or {}, run.get("virtual_service_changed") or {}
        rows.append(
            [
                run["scenario"],
                f"{spec['services']}/{spec['endpoints_per_service']}/{spec['proxies']}",
                run["variant"],
                run.get("protocol", "sotw"),
                run.get("sync_seconds"),
                run.get("sync_server_cpu_seconds"),
                run.get("steady_vcpu"),
                run.get("steady_rss_mib"),
                run.get("peak_rss_mib"),
                get(eds, "from_write_seconds", "p50"),
                get(eds, "from_write_seconds", "p99"),
                get(eds, "fan_out_seconds", "p99"),
                eds.get("server_cpu_seconds"),
                eds.get("fleet_cpu_seconds"),
                get(vs, "from_write_seconds", "p50"),
                get(vs, "from_write_seconds", "p99"),
                vs.get("server_cpu_seconds"),
                vs.get("fleet_cpu_seconds"),
            ]
        )
    out += table(
        [
            "scenario",
            "services/endpoints/proxies",
            "server",
            "protocol",
            "sync s",
            "sync CPU s",
            "steady vCPU",
            "steady RSS MiB",
            "peak RSS MiB",
            "EDS p50 s",
            "EDS p99 s",
            "EDS fan-out p99 s",
            "EDS CPU s",
            "EDS sim CPU s",
            "VS p50 s",
            "VS p99 s",
            "VS CPU s",
            "VS sim CPU s",
        ],
        rows,
    )
    skipped = []
    for run in runs:
        for change in ("endpoint_added", "virtual_service_changed"):
            server = get(run, change, "server") or {}
            if server:
                skipped.append(
                    [
                        run["scenario"],
                        run["variant"],
                        run.get("protocol", "sotw"),
                        change.replace("_", " "),
                        ", ".join(f"{k} {int(v)}" for k, v in sorted((server.get("pushes") or {}).items())),
                        ", ".join(
                            f"{k} {int(v)}"
                            for k, v in sorted((server.get("unchanged_skipped") or {}).items())
                        ),
                        _mean_ms(server.get("push_time_seconds")),
                        _mean_ms(server.get("send_time_seconds")),
                    ]
                )
    if skipped:
        out += [
            "**What each change sent** (responses by type; responses not sent because the proxy held them)",
            "",
        ]
        out += table(
            [
                "scenario",
                "server",
                "protocol",
                "change",
                "sent",
                "unchanged, not sent",
                "mean push ms",
                "mean send ms",
            ],
            skipped,
        )
    for image in images:
        out += [f"![{Path(image).stem}]({image})", ""]
    return out


def storms_run_apart(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The storms run apart from the rest of the suite (``--only storm``, merged in), which name their
    commit."""
    suite_commit = (results.get("machine") or {}).get("commit")
    return [s for s in results.get("storm") or [] if s.get("commit") and s["commit"] != suite_commit]


def storm_section(results: dict[str, Any]) -> list[str]:
    storms = results.get("storm") or []
    if not storms:
        return []
    out = ["### Reconnect storms", ""]
    out.append(
        "Every stream reconnects at once, at istiod's default stream rate (25 new streams/s on 2 CPUs; "
        "streams over the rate wait up to 1 s, then get RESOURCE_EXHAUSTED and retry with Envoy's "
        "backoff: a random wait under a ceiling doubling from 0.5 s to 30 s). First all streams drop "
        "while the server runs; then the server restarts (UNAVAILABLE until it has loaded its config). "
        "/ready is polled every 50 ms throughout. The Python gRPC client reports some refused streams "
        'as INTERNAL ("Internal error from Core") instead of RESOURCE_EXHAUSTED: when its first request '
        "is still being written as the status arrives, grpc.aio's client replaces the server's status "
        "(grpc/grpc#36066; reproduced with bare grpc.aio: 7 of 300 refusals on an idle machine, more under "
        "load); the simulator retries them the same way."
    )
    out.append("")
    for storm in storms_run_apart(results):
        when = f", {storm['date']}" if storm.get("date") else ""
        out += [
            f"The {storm['proxies']}-stream storm ran at commit {storm['commit']}{when}, "
            "apart from the rest of this suite (alone on the machine).",
            "",
        ]
    rows = []
    for storm in storms:
        for phase in ("streams_dropped", "server_restarted"):
            data = storm.get(phase) or {}
            rows.append(
                [
                    storm["proxies"],
                    phase.replace("_", " "),
                    data.get("resync_seconds"),
                    data.get("server_cpu_seconds"),
                    data.get("stream_attempts"),
                    data.get("rate_limited"),
                    ", ".join(f"{k} {v}" for k, v in sorted((data.get("streams_ended") or {}).items())),
                    data.get("empty_configs"),
                    get(data, "ready_latency_seconds", "p50"),
                    get(data, "ready_latency_seconds", "p99"),
                    get(data, "ready_latency_seconds", "max"),
                    data.get("ready_over_100ms"),
                    data.get("ready_failures"),
                ]
            )
    out += table(
        [
            "streams",
            "event",
            "all resynced s",
            "server CPU s",
            "stream attempts",
            "refused by rate",
            "streams ended (client view)",
            "empty configs",
            "/ready p50 s",
            "/ready p99 s",
            "/ready max s",
            "/ready > 100 ms",
            "/ready failures",
        ],
        rows,
    )
    return out


def _mean_ms(histogram: dict[str, float] | None) -> float | None:
    """Mean of the observations a change added: the change in sum over the change in count."""
    if not histogram or not histogram.get("count"):
        return None
    return round(1000 * histogram["sum"] / histogram["count"], 3)


def _floor_allocator(floors: list[dict[str, Any]]) -> str:
    """Which allocator the floor's server ran on, when the run recorded it: runs before c63e93b did not
    (from 461086d on, the floor ran on meshpilot's allocator; before it, on the C library's defaults)."""
    chosen = {floor.get("allocator") for floor in floors}
    if len(chosen) != 1 or None in chosen:
        return ""
    return f" (its server on {chosen.pop()}, with the allocator settings a meshpilot server started here has)"


def floor_section(results: dict[str, Any]) -> list[str]:
    floors: list[dict[str, Any]] = results.get("grpc_floor") or []
    if not floors:
        return []
    first = floors[0]
    out = ["### The floor: bare grpc.aio, no meshpilot", ""]
    cpus = (results.get("machine") or {}).get("cpus") or 1
    out.append(
        f"`python -m bench.grpc_floor`: a server process with {first['streams']} streams, each on its own "
        "connection from two client processes written like the simulator's. A round writes one "
        "pre-serialized message to every stream at once and ends when every client has answered with "
        "an ACK of the size the simulator sends for that type and protocol (a state-of-the-world EDS ACK "
        "names every cluster again; a delta ACK carries only the type and the nonce). The sizes are "
        "those the simulator measured in the first round of this run's fleet run of the same push and "
        "protocol where there was one ('sized from'), and then (after one warm-up round, not counted) a "
        "round of the floor is measured right after each round of that push, so that both sides of a "
        "ratio meet the host in the same minute; "
        "else the floor runs alone at the estimate written in `bench/run.py`. Nothing is generated or "
        "recorded: this is what gRPC and asyncio alone cost on this machine"
        + _floor_allocator(floors)
        + ", so a push of that size to as many proxies cannot fan out faster. The clients share the server's "
        f"{cpus} cores, as the simulator does: the CPU of both over the core count is the least wall "
        "time such a round can take here, whoever the server is."
    )
    out.append("")
    rows = [
        [
            floor.get("stands_for", ""),
            floor.get("protocol", "sotw"),
            floor.get("sized_from", "estimate"),
            floor["message_bytes"],
            floor.get("ack_bytes"),
            i + 1,
            f"{r['acks']}/{r['streams']}",
            r["wall_seconds"],
            r["server_cpu_seconds"],
            r["server_cpu_seconds"] / max(1, r["streams"]) * 1e6,
            r["client_cpu_seconds"],
            (r["server_cpu_seconds"] + r["client_cpu_seconds"]) / cpus,
        ]
        for floor in floors
        for i, r in enumerate(floor["rounds"])
    ]
    out += table(
        [
            "stands for",
            "protocol",
            "sized from",
            "message bytes",
            "ACK bytes",
            "round",
            "ACKs",
            "wall s",
            "server CPU s",
            "server µs/stream",
            "clients' CPU s",
            "CPU / cores s",
        ],
        rows,
    )
    return out
