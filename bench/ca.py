"""The mesh CA (issue 15): how fast it signs, and a certificate storm on a real ``meshpilot discovery``.

Signing rate: ``CertificateAuthority.sign`` in this process over CSRs made beforehand, in CSRs per
CPU-second (``time.process_time``), for RSA 2048 and ECDSA P-256 CSR keys under an RSA 2048 CA
(istiod's default) and an ECDSA P-256 CA.

Certificate storm: N workloads ask at once on the port that requires a client certificate
(``--secure-grpc-client-cert-addr``). Each holds a mesh certificate issued offline from the CA
directory the server then loads (``--self-signed-ca-dir``), so only the server's work is measured.
Each sends CreateCertificate for a fresh CSR and then opens an ADS stream for its own node (the
namespace and service account of its SPIFFE ID) and waits for the first CDS response; a refusal by
the stream rate limit (RESOURCE_EXHAUSTED) is retried with Envoy's backoff. /ready is sampled every
50 ms throughout, and the server's CPU from /proc.

``python -m bench.ca --suite quick`` runs the suite's CA job alone and stores it under ``ca`` in
``bench/results/<suite>.json`` (the rest of the file is kept), then rewrites docs/benchmarks.md;
``python -m bench.run`` runs it with the rest of the suite.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.ca_job import CaJob
from bench.ca_keys import ALGORITHM_NAMES
from bench.ca_signing import run_signing
from bench.ca_storm import run_storm
from bench.measure import log
from bench.tables import fmt, get, table


def run(job: CaJob, workdir: Path | None = None) -> dict[str, Any]:
    """Both parts of the CA benchmark."""
    with tempfile.TemporaryDirectory(prefix="meshpilot-bench-ca-") as tmp:
        where = workdir or Path(tmp)
        log(f"CA signing rate, {job.sign_count} CSRs per key pair")
        out: dict[str, Any] = {"signing": run_signing(job.sign_count, where)}
        log(json.dumps(out["signing"]))
        log(f"certificate storm, {job.workloads} workloads")
        storm_dir = where / "storm"
        storm_dir.mkdir(exist_ok=True)
        out["storm"] = run_storm(job, storm_dir)
        log(json.dumps({k: v for k, v in out["storm"].items() if not isinstance(v, dict | list)}))
    return out


# -- the report --------------------------------------------------------------------------


def goals(results: dict[str, Any]) -> list[list[Any]]:
    """The issue's goal for the certificate storm: /ready under 100 ms throughout."""
    storm = get(results, "ca", "storm")
    if not storm:
        return []
    rows = []
    for what in ("p99", "max"):
        measured = get(storm, "ready_latency_seconds", what)
        verdict = "-" if measured is None else "met" if measured <= 0.1 else f"missed ({measured / 0.1:.2f}x)"
        rows.append(
            [
                f"{storm['workloads']} workloads' certificate storm: /ready {what} latency",
                "0.1 s",
                f"{fmt(measured)} s",
                verdict,
            ]
        )
    return rows


def section(results: dict[str, Any]) -> list[str]:
    ca = results.get("ca")
    if not ca:
        return []
    out = ["### The mesh CA", ""]
    machine = ca.get("machine") or {}
    if machine:
        out += [
            f"Measured apart from the rest of this suite (`python -m bench.ca`): commit "
            f"{machine.get('commit', '?')}, {machine.get('date', '?')}.",
            "",
        ]
    out.append(
        "**Signing rate.** `CertificateAuthority.sign` in the benchmark's process on CSRs made "
        "beforehand (each on its own key, with the workload's SPIFFE ID), timed with "
        "`time.process_time` over the whole batch after one warm-up signature: what each certificate "
        "costs the CA's CPU (parsing and checking the CSR, building and signing the certificate), "
        "without gRPC or TLS."
    )
    out.append("")
    out += table(
        ["CA key", "CSR key", "CSRs", "CPU s", "CSRs per CPU-second", "CPU ms per certificate"],
        [
            [
                ALGORITHM_NAMES.get(s["ca_key"], s["ca_key"]),
                ALGORITHM_NAMES.get(s["csr_key"], s["csr_key"]),
                s["count"],
                s["cpu_seconds"],
                s["per_cpu_second"],
                s["cpu_ms_per_certificate"],
            ]
            for s in ca.get("signing") or []
        ],
    )
    storm = ca.get("storm")
    if storm:
        out.append(
            f"**Certificate storm.** {storm['workloads']} workloads at once against a real `meshpilot "
            "discovery` (its CA key "
            f"{ALGORITHM_NAMES.get(storm['ca_key'], storm['ca_key'])}), on the port that requires a mesh "
            "client certificate. Each already holds one (an ECDSA P-256 key; issued before the storm from "
            "the CA directory the server loads) and, on its own TLS connection, asks CreateCertificate "
            f"to sign a fresh CSR ({ALGORITHM_NAMES.get(storm['csr_key'], storm['csr_key'])}), then opens "
            "an ADS stream for its own node (the namespace and service account of its SPIFFE ID) and "
            "waits for the first CDS response. New streams are held to istiod's default rate (25 per "
            "second on 2 CPUs; a stream that waits over 1 s is refused with RESOURCE_EXHAUSTED and "
            "retried with Envoy's backoff), so the time until all streams are served is that rate's, "
            "not the server's CPU. Refusals are as the clients saw them; grpc.aio reports some "
            "rate-limit refusals as INTERNAL (grpc/grpc#36066), counted with them. Keys and CSRs are "
            f"made before the storm; {storm['client_processes']} client processes, each with its "
            "workloads' channels in one asyncio loop, share the server's cores. Server CPU is from "
            "/proc; /ready is polled every 50 ms throughout. There is no istiod column: istiod's CA "
            "needs a Kubernetes setup (its self-signed root kept in a Secret, tokens reviewed by the "
            "API server) that the bench's stub API server cannot give."
        )
        out.append("")
        refused = ", ".join(f"{k} {v}" for k, v in sorted((storm.get("refused") or {}).items())) or "none"
        latency = storm.get("ready_latency_seconds") or {}
        ready = " / ".join(fmt(latency.get(q), 3) for q in ("p50", "p99", "max")) + " s"
        probes = ", ".join(str(storm.get(k)) for k in ("ready_probes", "ready_over_100ms", "ready_failures"))
        out += table(
            ["measure", "value"],
            [
                ["certificates issued / streams served", f"{storm['certificates_issued']} / "
                 f"{storm['streams_served']} of {storm['workloads']}"],
                ["first CDS responses empty", storm.get("empty_configs")],
                ["refused by the rate limit / otherwise (client view)",
                 f"{storm.get('refused_by_rate_limit')} / {storm.get('refused_otherwise')}"],
                ["refusals by status", refused],
                ["server counters: issued, sign errors, auth failures, rate-limited",
                 ", ".join(str(int(get(storm, "server", k) or 0)) for k in (
                     "citadel_server_success_cert_issuance_count",
                     "citadel_server_csr_sign_err_count",
                     "citadel_server_authentication_failure_count",
                     "meshpilot_xds_rate_limited"))],
                ["all certificates issued after", f"{fmt(storm.get('all_certificates_seconds'))} s"],
                ["certificate latency p50 / p99", f"{fmt(get(storm, 'certificate_seconds', 'p50'))} / "
                 f"{fmt(get(storm, 'certificate_seconds', 'p99'))} s"],
                ["all streams served after", f"{fmt(storm.get('all_streams_seconds'))} s"],
                ["server CPU until all certificates / in all",
                 f"{fmt(storm.get('server_cpu_until_certificates_seconds'))} / "
                 f"{fmt(storm.get('server_cpu_seconds'))} s"],
                ["clients' CPU", f"{fmt(storm.get('client_cpu_seconds'))} s"],
                ["/ready p50 / p99 / max", ready],
                ["/ready probes, > 100 ms, failed", probes],
                ["peak RSS", f"{fmt(storm.get('peak_rss_mib'))} MiB"],
            ],
        )  # fmt: skip
    return out


# -- standalone --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    from bench.run import RESULTS, machine, suites

    parser = argparse.ArgumentParser(prog="python -m bench.ca", description=__doc__.split("\n")[0])
    parser.add_argument("--suite", choices=sorted(suites()), default="quick")
    parser.add_argument("--workloads", type=int, help="storm size (default: the suite's)")
    parser.add_argument("--sign-count", type=int, help="CSRs per key pair (default: the suite's)")
    parser.add_argument("--csr-key", choices=("rsa", "ecdsa"), help="fresh CSRs' key in the storm")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--no-report", action="store_true", help="do not rewrite docs/benchmarks.md")
    args = parser.parse_args(argv)
    job = suites()[args.suite].ca
    if job is None:
        parser.error(f"the {args.suite} suite has no CA job")
    overrides = {"workloads": args.workloads, "sign_count": args.sign_count, "csr_key": args.csr_key}
    job = CaJob(**{**asdict(job), **{k: v for k, v in overrides.items() if v is not None}})
    found = {"machine": machine(), **run(job)}
    path = args.out / f"{args.suite}.json"
    results = json.loads(path.read_text()) if path.exists() else {"suite": args.suite}
    results["ca"] = found
    args.out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    log(f"wrote the CA results to {path}")
    if not args.no_report:
        from bench.report import write_report

        write_report(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
