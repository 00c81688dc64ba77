"""docs/benchmarks.md and its plots, from bench/results/*.json (``python -m bench.report``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench import bulk_config, pool_bench, report_delta
from bench import ca as ca_bench
from bench.report_peer import peer_section
from bench.tables import fleet_run, fmt, get, goal_row, table

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
IMAGES = ROOT / "docs" / "img" / "benchmarks"
#: The hand-written analysis, appended as it is.
NOTES = ROOT / "bench" / "notes.md"
#: The name's end of the plot of a push's CPU against the floor's (report_delta).
PUSH_FLOOR_IMAGE = "-push-floor.png"


def goals(results: dict[str, Any]) -> list[list[Any]]:
    """(goal, target, measured, verdict) rows for the issue's goals."""
    micro = get(results, "micro", "compiled") or {}
    rows: list[list[Any]] = []
    apart = _micro_apart(results)
    micro_tag = f" (commit {apart})" if apart else ""

    def row(
        goal: str, target: float, measured: float | None, unit: str, higher_is_better: bool = False
    ) -> None:
        rows.append(goal_row(goal, target, measured, unit, higher_is_better))

    def micro_row(goal: str, target: float, measured: float | None, unit: str, higher: bool = False) -> None:
        row(goal + micro_tag, target, measured, unit, higher)

    eds = micro.get("eds_encoding") or []
    for entry in eds:
        micro_row(
            f"EDS encoding, {entry['endpoints']} endpoints/CLA", 1.0, entry.get("compiled_us"), "µs/endpoint"
        )
    worst_ratio = min((e.get("compiled_vs_twin", 0.0) for e in eds), default=None)
    micro_row("EDS encoding, compiled vs pure-Python twin (worst case)", 20, worst_ratio, "x", higher=True)
    micro_row(
        "CDS uncached generation (no DestinationRules: one template, the best case)",
        5.0,
        get(micro, "generators", "cds_uncached_us_per_cluster"),
        "µs/cluster",
    )
    micro_row(
        f"CDS uncached generation, a DestinationRule per service ({_rule_policies(micro)})",
        5.0,
        get(micro, "generators", "cds_dr_uncached_us_per_cluster"),
        "µs/cluster",
    )
    micro_row(
        "CDS uncached generation, a DestinationRule per service, each its own policy (the worst case)",
        5.0,
        get(micro, "generators", "cds_dr_distinct_uncached_us_per_cluster"),
        "µs/cluster",
    )
    micro_row(
        "RDS uncached generation", 3.0, get(micro, "generators", "rds_uncached_us_per_vhost"), "µs/vhost"
    )
    micro_row(
        "Sending a cached ClusterLoadAssignment", 5.0, get(micro, "cached_cla_send", "compiled_us"), "µs"
    )
    http = fleet_run(results, "http")
    if http is not None:
        scale = f"{http['scenario_spec']['proxies']} sidecars, {http['scenario_spec']['services']} services"
        row(f"Steady-state CPU ({scale})", 0.5, http.get("steady_vcpu"), "vCPU")
        row(f"Steady-state RSS ({scale})", 1024, http.get("steady_rss_mib"), "MiB")
        row(f"Peak RSS, including the initial sync ({scale})", 1024, http.get("peak_rss_mib"), "MiB")
        eds_change = http.get("endpoint_added") or {}
        p99 = get(eds_change, "from_write_seconds", "p99")
        after_debounce = p99 - 0.1 if p99 is not None else None
        row(f"Endpoint added: p99 after the debounce ({scale})", 0.3, after_debounce, "s")
        row(f"Endpoint added: p99 fan-out ({scale})", 0.3, get(eds_change, "fan_out_seconds", "p99"), "s")
        vs_change = http.get("virtual_service_changed") or {}
        row(
            f"VirtualService changed: p99 from the write ({scale})",
            1.0,
            get(vs_change, "from_write_seconds", "p99"),
            "s",
        )
    for storm in results.get("storm", []):
        for phase in ("streams_dropped", "server_restarted"):
            data = storm.get(phase) or {}
            label = f"{storm['proxies']} streams reconnecting ({phase.replace('_', ' ')})"
            row(f"{label}: /ready p99 latency", 0.1, get(data, "ready_latency_seconds", "p99"), "s")
            row(f"{label}: /ready max latency", 0.1, get(data, "ready_latency_seconds", "max"), "s")
            row(f"{label}: proxies served empty config", 0, data.get("empty_configs"), "")
    return rows


# -- sections --------------------------------------------------------------------------


def _rule_policies(micro: dict[str, Any]) -> str:
    """How the rules of the micro benchmark's rule row differ (results before 92d40be do not say)."""
    count = get(micro, "generators", "rule_policies")
    return f"{count} distinct policies" if count else "a template per rule: measured before 92d40be"


def _micro_apart(results: dict[str, Any]) -> str:
    """The commit of micro figures re-measured alone (``--only micro``, merged in), else ""."""
    commit = str(get(results, "micro", "commit") or "")
    return commit if commit and commit != (results.get("machine") or {}).get("commit") else ""


def micro_section(results: dict[str, Any]) -> list[str]:
    micro = results.get("micro") or {}
    compiled, pure = micro.get("compiled") or {}, micro.get("pure-python") or {}
    if not compiled:
        return []
    out = ["### Hot paths (micro benchmarks)", ""]
    apart = _micro_apart(results)
    when = f" Measured at commit {apart}, {micro.get('date', '?')}, apart from the fleets." if apart else ""
    out.append(
        "Best of several timed batches, one process per build. The pure-Python column is the same code "
        "with `MESHPILOT_NO_EXTENSIONS=1`; protobuf is the reference builder that makes message objects "
        f"and serializes them.{when}"
    )
    out.append("")
    rows = [
        [
            e["endpoints"],
            e["protobuf_us"],
            e["twin_us"],
            e["compiled_us"],
            e["compiled_vs_twin"],
            e["compiled_vs_protobuf"],
        ]
        for e in compiled.get("eds_encoding", [])
    ]
    out += ["**EDS: one ClusterLoadAssignment, µs per endpoint**", ""]
    out += table(
        ["endpoints", "protobuf", "pure-Python twin", "compiled", "compiled vs twin", "compiled vs protobuf"],
        rows,
    )
    gen_c, gen_p = compiled.get("generators") or {}, pure.get("generators") or {}
    out += ["**Generation without the cache**", ""]
    rules = (
        f"with {gen_c['rule_policies']} distinct policies among the rules (their connection limits "
        "differ): clusters whose rules resolve to the same policy share a template, whichever rule it "
        "came from. The third gives every rule a policy of its own, the worst case: each service's "
        "clusters build their own templates with the reference builder, as a mesh whose rules all "
        "differ does after any config change."
        if gen_c.get("rule_policies")
        else "measured before 92d40be, when the encoder kept a template per rule: each service's "
        "clusters built their own templates with the reference builder after any config change."
    )
    out.append(
        "A 200-service model. The first CDS row is the encoder's best case: with no DestinationRules "
        "every outbound cluster is one template plus its name, metadata and TLS. The second gives "
        "each service a DestinationRule (two subsets; connection pool, outlier detection, load "
        f"balancer), {rules}"
    )
    out.append("")
    out += table(
        ["what", "protobuf objects", "pure-Python build", "compiled build"],
        [
            [
                "CDS, µs per outbound cluster (no DestinationRules, the best case)",
                gen_c.get("cds_protobuf_us_per_cluster"),
                gen_p.get("cds_uncached_us_per_cluster"),
                gen_c.get("cds_uncached_us_per_cluster"),
            ],
            [
                f"CDS, µs per outbound cluster, a DestinationRule per service ({_rule_policies(compiled)})",
                gen_c.get("cds_dr_protobuf_us_per_cluster"),
                gen_p.get("cds_dr_uncached_us_per_cluster"),
                gen_c.get("cds_dr_uncached_us_per_cluster"),
            ],
            [
                "CDS, µs per outbound cluster, every rule its own policy (the worst case)",
                gen_c.get("cds_dr_distinct_protobuf_us_per_cluster"),
                gen_p.get("cds_dr_distinct_uncached_us_per_cluster"),
                gen_c.get("cds_dr_distinct_uncached_us_per_cluster"),
            ],
            [
                "RDS, µs per virtual host",
                gen_c.get("rds_protobuf_us_per_vhost"),
                gen_p.get("rds_uncached_us_per_vhost"),
                gen_c.get("rds_uncached_us_per_vhost"),
            ],
            [
                "CDS cache key, µs per cluster",
                None,
                gen_p.get("cds_key_us_per_cluster"),
                gen_c.get("cds_key_us_per_cluster"),
            ],
        ],
    )
    send, hashes, index = (
        compiled.get("cached_cla_send") or {},
        compiled.get("config_hash") or {},
        compiled.get("endpoint_index_update") or {},
    )
    out += ["**Other hot paths, µs per call**", ""]
    out += table(
        ["what", "pure-Python twin", "compiled"],
        [
            [
                "cached CLA: cache lookup + DiscoveryResponse assembly",
                send.get("twin_us"),
                send.get("compiled_us"),
            ],
            [
                "config hash of a VirtualService-sized value",
                hashes.get("value_twin_us"),
                hashes.get("value_compiled_us"),
            ],
            [
                "config hash of 1,800 serialized bytes",
                hashes.get("bytes_twin_us"),
                hashes.get("bytes_compiled_us"),
            ],
            [
                "EndpointIndex update (100 endpoints, one changed)",
                index.get("twin_us"),
                index.get("compiled_us"),
            ],
        ],
    )
    return out


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
        "file and the 100 ms debounce; 'fan-out' is measured from the first proxy's copy, so it shows "
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
        )
        out.append("")
        out += ["### Goals", ""]
        out += table(
            ["goal", "target", "measured", "verdict"],
            goals(results)
            + report_delta.goals(results)
            + ca_bench.goals(results)
            + pool_bench.goals(results),
        )
        out += micro_section(results)
        images = plots(results, suite)
        floor_image = next((i for i in images if i.endswith(PUSH_FLOOR_IMAGE)), None)
        out += fleet_section(results, [i for i in images if i != floor_image])
        out += report_delta.protocol_section(results)
        out += peer_section(results)
        out += floor_section(results)
        out += report_delta.push_floor_section(results, floor_image)
        out += storm_section(results)
        out += pool_bench.section(results)
        out += ca_bench.section(results)
        out += bulk_config.section(results)
    kube = all_results.get("kube")
    if kube is not None:
        out += kube_section(kube)
    if NOTES.exists():
        out += ["", NOTES.read_text().strip(), ""]
    return "\n".join(out).rstrip() + "\n"


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
        "those the simulator measured in this run's fleet run of the same push and protocol where there "
        "was one ('sized from'), else the estimate written in `bench/run.py`. Nothing is generated or "
        "recorded: this is what gRPC and asyncio alone cost on this machine, so "
        "a push of that size to as many proxies cannot fan out faster. The clients share the server's "
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
