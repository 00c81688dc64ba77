"""The micro benchmarks' part of docs/benchmarks.md: their goal rows and their section
(``bench/micro.py``'s figures, compiled against the pure-Python twins and protobuf objects)."""

from __future__ import annotations

from typing import Any

from bench.tables import get, goal_row, table


def goals(results: dict[str, Any]) -> list[list[Any]]:
    """(goal, target, measured, verdict) rows of the micro benchmarks."""
    micro = get(results, "micro", "compiled") or {}
    rows: list[list[Any]] = []
    apart = _apart(results)
    micro_tag = f" (commit {apart})" if apart else ""

    def row(goal: str, target: float, measured: float | None, unit: str, higher: bool = False) -> None:
        rows.append(goal_row(goal + micro_tag, target, measured, unit, higher))

    eds = micro.get("eds_encoding") or []
    for entry in eds:
        row(f"EDS encoding, {entry['endpoints']} endpoints/CLA", 1.0, entry.get("compiled_us"), "µs/endpoint")
    worst_ratio = min((e.get("compiled_vs_twin", 0.0) for e in eds), default=None)
    row("EDS encoding, compiled vs pure-Python twin (worst case)", 20, worst_ratio, "x", higher=True)
    row(
        "CDS uncached generation (no DestinationRules: one template, the best case)",
        5.0,
        get(micro, "generators", "cds_uncached_us_per_cluster"),
        "µs/cluster",
    )
    row(
        f"CDS uncached generation, a DestinationRule per service ({_policies(micro)})",
        5.0,
        get(micro, "generators", "cds_dr_uncached_us_per_cluster"),
        "µs/cluster",
    )
    row(
        "CDS uncached generation, a DestinationRule per service, each its own policy (the worst case)",
        5.0,
        get(micro, "generators", "cds_dr_distinct_uncached_us_per_cluster"),
        "µs/cluster",
    )
    row("RDS uncached generation", 3.0, get(micro, "generators", "rds_uncached_us_per_vhost"), "µs/vhost")
    row("Sending a cached ClusterLoadAssignment", 5.0, get(micro, "cached_cla_send", "compiled_us"), "µs")
    return rows


def _policies(micro: dict[str, Any]) -> str:
    """How the rules of the micro benchmark's rule row differ (results before 92d40be do not say)."""
    count = get(micro, "generators", "rule_policies")
    return f"{count} distinct policies" if count else "a template per rule: measured before 92d40be"


def _apart(results: dict[str, Any]) -> str:
    """The commit of micro figures re-measured alone (``--only micro``, merged in), else ""."""
    commit = str(get(results, "micro", "commit") or "")
    return commit if commit and commit != (results.get("machine") or {}).get("commit") else ""


def section(results: dict[str, Any]) -> list[str]:
    micro = results.get("micro") or {}
    compiled, pure = micro.get("compiled") or {}, micro.get("pure-python") or {}
    if not compiled:
        return []
    out = ["### Hot paths (micro benchmarks)", ""]
    apart = _apart(results)
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
                f"CDS, µs per outbound cluster, a DestinationRule per service ({_policies(compiled)})",
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
