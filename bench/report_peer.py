"""The "Beside istiod" section of docs/benchmarks.md: istiod's column next to meshpilot's."""

from __future__ import annotations

from typing import Any

from bench.tables import counts, get, table


def _ratio(ours: Any, theirs: Any) -> str:
    """meshpilot's figure over istiod's, as '0.42x'; '-' where either is missing or istiod's is 0."""
    if not isinstance(ours, int | float) or not isinstance(theirs, int | float) or not theirs:
        return "-"
    return f"{ours / theirs:.2f}x"


def _peer_rows(ours: dict[str, Any], theirs: dict[str, Any]) -> list[list[Any]]:
    """(measure, istiod, meshpilot, meshpilot/istiod) for one scenario's two runs."""
    rows: list[list[Any]] = []

    def row(label: str, *path: str) -> None:
        a, b = get(theirs, *path), get(ours, *path)
        rows.append([label, a, b, _ratio(b, a)])

    def text(label: str, render: Any, *path: str) -> None:
        rows.append([label, render(get(theirs, *path)), render(get(ours, *path)), "-"])

    row("ready after start, s", "ready_seconds")
    row("initial sync of every sidecar, s", "sync_seconds")
    row("server CPU during the sync, s", "sync_server_cpu_seconds")
    row("bytes per sidecar at sync", "sync_bytes_per_proxy")
    text("resources of one sidecar", lambda v: _plain(v) if v else "-", "resources_per_proxy")
    same = ours.get("resource_names_digest") == theirs.get("resource_names_digest")
    rows.append(["same resource names as istiod's", "-", "yes" if same else "**no**", "-"])
    row("steady CPU, vCPU", "steady_vcpu")
    row("steady RSS, MiB", "steady_rss_mib")
    row("peak RSS, MiB", "peak_rss_mib")
    row("unchanged file rewritten: server CPU over 2 s, s", "unchanged_rewrite", "server_cpu_seconds")
    changes = (("endpoint_added", "endpoint added"), ("virtual_service_changed", "VirtualService changed"))
    for change, label in changes:
        if change not in ours and change not in theirs:
            continue
        text(
            f"{label}: proxies converged",
            lambda v: "-" if not v else f"{v['converged']}/{v['proxies']}",
            change,
        )
        row(f"{label}: from write p50, s", change, "from_write_seconds", "p50")
        row(f"{label}: from write p99, s", change, "from_write_seconds", "p99")
        row(f"{label}: fan-out p50, s", change, "fan_out_seconds", "p50")
        row(f"{label}: fan-out p99, s", change, "fan_out_seconds", "p99")
        row(f"{label}: server CPU, s", change, "server_cpu_seconds")
        # Less what reading the files cost (the unchanged rewrite): the push's share, roughly. A
        # difference of two readings in 10 ms ticks, so no ratio: at a few ticks it would be noise.
        a, b = (_less_rewrite(run, change) for run in (theirs, ours))
        rows.append([f"{label}: server CPU less the unchanged rewrite's (estimate), s", a, b, "-"])
        row(f"{label}: simulator CPU, s", change, "fleet_cpu_seconds")
        text(f"{label}: responses sent", counts, change, "server", "pushes")
    return rows


def _less_rewrite(run: dict[str, Any], change: str) -> float | None:
    cpu, rewrite = (
        get(run, change, "server_cpu_seconds"),
        get(run, "unchanged_rewrite", "server_cpu_seconds"),
    )
    if cpu is None or rewrite is None:
        return None
    return round(max(0.0, float(cpu) - float(rewrite)), 3)


def _count(scenarios: int) -> str:
    return "one scenario" if scenarios == 1 else f"{scenarios} scenarios"


def _plain(values: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in values.items())


def peer_section(results: dict[str, Any]) -> list[str]:
    """meshpilot beside istiod (``python -m bench.run --peer istiod``): two columns per scenario."""
    peer = results.get("peer") or {}
    runs = peer.get("runs") or []
    if not runs:
        return []
    out = ["### Beside istiod", ""]
    scenarios = len({run["scenario"] for run in runs})
    # A peer run made apart from the rest of the suite (``--only``, merged in) names its own commit.
    when = (
        f"at commit {peer['commit']}, {peer['date']}, apart from the rest of this suite"
        if peer.get("commit") and peer.get("commit") != (results.get("machine") or {}).get("commit")
        else "in this run"
    )
    out.append(
        f"`python -m bench.run --peer istiod`: istiod {peer.get('version', '?')} "
        f"(`{peer.get('binary', '?')}`, "
        f"built by `make reference`) and meshpilot, one after the other {when} (meshpilot first), on the "
        "same machine, "
        "simulator and config directory: istiod is the anchor the other figures on this page are read "
        "against. istiod reads only Istio kinds from files, so both servers read the scenario's "
        "**ServiceEntry form**: each service is a ServiceEntry (resolution STATIC, location MESH_INTERNAL) "
        "with the Kubernetes Service's host, VIP and ports, and its pods' addresses, labels and service "
        "account as inline endpoints. The sidecars are clients on addresses of their own, so neither server "
        "gives them inbound services (istiod finds a sidecar's services among ServiceEntry endpoints by its "
        "address; meshpilot looks only among Kubernetes Pods), and the simulator checks that both gave the "
        "first sidecar resources of the same names. Both servers have the same debounce "
        f"({peer.get('debounce', '100ms')}: `PILOT_DEBOUNCE_AFTER`) and new-stream rate "
        "(`PILOT_MAX_REQUESTS_PER_SECOND`); istiod keeps its other defaults (XdsCache on), runs without "
        "a CA (`ENABLE_CA_SERVER=false`) and, as it does not start without a Kubernetes client, has one "
        "on an empty API server (`bench/kube_stub.py`, its own process, counted in neither). "
        "The servers read files differently: istiod's file source waits 250 ms after a change, then reads "
        "and parses every file of the directory again; meshpilot reads the changed file about 50 ms after "
        "it. 'From write' includes that, 'fan-out' (from the first proxy's copy) does not, and the "
        "unchanged rewrite shows what reading files alone costs each. The last column is meshpilot's "
        "figure over istiod's: below 1 is less time, CPU or memory than istiod's. The initial sync's "
        "wall time is mostly the stream rate (sidecars over new streams/s); its CPU is the comparison. "
        "Where meshpilot is ahead, read why: on a VirtualService change it sends only the route "
        "configuration (its digest skips types whose content did not change), while istiod sends CDS, "
        f"LDS and RDS again ('responses sent'); and this is {_count(scenarios)} of the "
        f"{results.get('suite', '?')} suite, on files, with no TLS or security policy in play, run once each."
    )
    out.append("")
    by_scenario: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for run in runs:
        key = (run["scenario"], run.get("protocol", "sotw"))
        by_scenario.setdefault(key, {})[run.get("server", "meshpilot")] = run
    for (name, protocol), pair in by_scenario.items():
        ours, theirs = pair.get("meshpilot"), pair.get("istiod")
        if ours is None or theirs is None:
            continue
        spec = ours["scenario_spec"]
        out += [
            f"**{name}, {'delta' if protocol == 'delta' else 'state-of-the-world'} sidecars**: "
            f"{spec['services']} services x {spec['endpoints_per_service']} endpoints, "
            f"{spec['proxies']} sidecars, {spec['virtual_services']} VirtualService(s), "
            f"{ours.get('connect_rate') or 'default'} new streams/s",
            "",
        ]
        out += table(["measure", "istiod", "meshpilot", "meshpilot / istiod"], _peer_rows(ours, theirs))
    return out
