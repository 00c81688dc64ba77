"""The certificate storm: N workloads at once against a real ``meshpilot discovery``, /ready and the
server's CPU sampled throughout."""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import threading
import time
from pathlib import Path
from typing import Any

from bench.ca_job import CaJob
from bench.ca_keys import authority_in, csr_batch, make_csrs, spiffe_id
from bench.ca_storm_client import RATE_LIMIT_CODES, Workload, worker_main
from bench.measure import DEBOUNCE, fleet_specs, summary
from bench.scenario import Scenario
from bench.server import ServerProcess, free_port, process_cpu_seconds
from meshpilot.ca.authority import CertificateAuthority


class Sampler(threading.Thread):
    """Every ``interval``: how long /ready took to answer (None: no answer in 5 s), its status, and the
    server's CPU seconds so far."""

    def __init__(self, server: ServerProcess, interval: float) -> None:
        super().__init__(daemon=True)
        self.server, self.interval = server, interval
        self.samples: list[tuple[float, float | None, int, float]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            started = time.perf_counter()
            try:
                status, _ = self.server.get("/ready", timeout=5)
                took: float | None = time.perf_counter() - started
            except OSError:
                status, took = 0, None
            self.samples.append((time.time(), took, status, self.server.cpu_seconds()))
            self.stopping.wait(self.interval)

    def cpu_at(self, moment: float) -> float | None:
        """The server's CPU seconds at the first sample taken at or after ``moment``."""
        return next((cpu for at, _, _, cpu in self.samples if at >= moment), None)


def _workloads(job: CaJob, scenario: Scenario, authority: CertificateAuthority) -> list[Workload]:
    """Every workload's node, a mesh certificate issued offline, and a fresh CSR; all before the storm."""
    specs = fleet_specs(scenario)
    identities = []
    for i in range(scenario.proxies):
        namespace = scenario.namespace(i % scenario.services)
        identities.append(spiffe_id(namespace, scenario.service_name(i % scenario.services)))
    # The certificate held before the storm: an ECDSA key (quick to make; the server's side of the
    # handshake verifies the CA's signature on it either way), signed here from the CA directory.
    held = csr_batch("ecdsa", identities)
    fresh = make_csrs(job.csr_key, identities)
    out = []
    for spec, identity, (key_pem, held_csr), (_, csr) in zip(specs, identities, held, fresh, strict=True):
        chain = authority.sign(held_csr, [identity])
        namespace, account = identity.split("/")[-3], identity.split("/")[-1]
        metadata = {**spec.metadata, "NAMESPACE": namespace, "SERVICE_ACCOUNT": account}
        out.append(Workload(spec.node_id, metadata, key_pem, "".join(chain[:-1]), csr.decode()))
    return out


def _scenario(workloads: int) -> Scenario:
    """The reconnect storm's mesh shape (bench/scenarios/storm.yaml) with one proxy per workload."""
    return Scenario(
        name=f"ca-storm-{workloads}",
        services=min(100, workloads),
        endpoints_per_service=10,
        proxies=workloads,
        namespaces=min(10, workloads),
    )


def _metric(metrics: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in metrics.items() if k.startswith(prefix) and not k.endswith("_created"))


def run_storm(job: CaJob, workdir: Path) -> dict[str, Any]:
    scenario = _scenario(job.workloads)
    config = workdir / "config"
    scenario.write(config)
    ca_dir = workdir / "ca"
    authority = authority_in(ca_dir, job.ca_key)
    prepared = time.time()
    workloads = _workloads(job, scenario, authority)
    result: dict[str, Any] = {
        "workloads": job.workloads,
        "ca_key": job.ca_key,
        "csr_key": job.csr_key,
        "held_key": "ecdsa",
        "client_processes": job.client_processes,
        "prepare_seconds": round(time.time() - prepared, 1),
    }
    cert_port = free_port()
    server = ServerProcess(
        config,
        workdir,
        extra=[
            "--debounce-after",
            DEBOUNCE,
            "--secure-grpc-addr",
            f"127.0.0.1:{free_port()}",
            "--secure-grpc-client-cert-addr",
            f"127.0.0.1:{cert_port}",
            "--self-signed-ca-dir",
            str(ca_dir),
            "--ca-key-algorithm",
            job.ca_key,
        ],
    )
    ctx = multiprocessing.get_context("spawn")
    conns: list[multiprocessing.connection.Connection] = []
    processes: list[Any] = []
    try:
        server.start()
        root_pem = authority.root_pem.encode()
        for w in range(job.client_processes):
            parent, child = ctx.Pipe()
            share = workloads[w :: job.client_processes]
            process = ctx.Process(
                target=worker_main, args=(child, f"127.0.0.1:{cert_port}", root_pem, share), daemon=True
            )
            process.start()
            conns.append(parent)
            processes.append(process)
        for conn in conns:
            if not conn.poll(120) or conn.recv() != "ready":
                raise TimeoutError("a storm client did not start")
        time.sleep(1)  # let the server settle after the clients' start
        sampler = Sampler(server, job.ready_interval)
        sampler.start()
        time.sleep(job.ready_interval * 4)  # a few samples of the quiet server first
        metrics_before = server.metrics()
        client_cpu = sum(process_cpu_seconds(p.pid) for p in processes)
        cpu, started = server.cpu_seconds(), time.time()
        for conn in conns:
            conn.send(("go", started + job.timeout))
        outcomes: list[dict[str, Any]] = []
        for conn in conns:
            if not conn.poll(job.timeout + 60):
                raise TimeoutError("a storm client did not report")
            outcomes += conn.recv()
        ended = time.time()
        client_cpu = sum(process_cpu_seconds(p.pid) for p in processes) - client_cpu
        time.sleep(job.ready_interval * 4)
        sampler.stopping.set()
        sampler.join(10)
        metrics = server.metrics()
        result.update(_storm_figures(outcomes, sampler, started, ended, cpu))
        result["client_cpu_seconds"] = round(client_cpu, 3)
        result["server"] = {
            name: _metric(metrics, name) - _metric(metrics_before, name)
            for name in (
                "citadel_server_csr_count",
                "citadel_server_success_cert_issuance_count",
                "citadel_server_csr_sign_err_count",
                "citadel_server_authentication_failure_count",
                "meshpilot_xds_rate_limited",
                "meshpilot_xds_auth_failures",
            )
        }
        result["peak_rss_mib"] = round(server.memory()["peak_rss_mib"], 1)
    finally:
        for process in processes:
            process.join(10)
            if process.is_alive():
                process.terminate()
        result["exit_code"] = server.stop()
    return result


def _storm_figures(
    outcomes: list[dict[str, Any]], sampler: Sampler, started: float, ended: float, cpu: float
) -> dict[str, Any]:
    certs = [o["cert_at"] - started for o in outcomes if o["cert_at"] is not None]
    served = [o["served_at"] - started for o in outcomes if o["served_at"] is not None]
    refused: dict[str, int] = {}
    for o in outcomes:
        for key, n in (o["refused"] or {}).items():
            refused[key] = refused.get(key, 0) + n
    rate_limited = sum(
        n for k, n in refused.items() if k.startswith("ads ") and k.split(" ", 1)[1] in RATE_LIMIT_CODES
    )
    in_storm = [s for s in sampler.samples if started <= s[0] <= ended]
    latencies = [s[1] for s in in_storm if s[1] is not None and s[2] == 200]
    certs_done = started + max(certs) if certs else None
    cpu_certs = sampler.cpu_at(certs_done) if certs_done is not None else None
    cpu_end = sampler.cpu_at(ended)
    return {
        "certificates_issued": len(certs),
        "streams_served": len(served),
        "all_served": len(served) == len(outcomes),
        "empty_configs": sum(1 for o in outcomes if o["empty"]),
        "certificate_attempts": sum(o["cert_attempts"] for o in outcomes),
        "stream_attempts": sum(o["stream_attempts"] for o in outcomes),
        # As the clients saw them: RESOURCE_EXHAUSTED, and INTERNAL where grpc.aio lost that status.
        "refused": refused,
        "refused_by_rate_limit": rate_limited,
        "refused_otherwise": sum(refused.values()) - rate_limited,
        "refusal_samples": sorted({o["sample"] for o in outcomes if o["sample"]})[:5],
        "all_certificates_seconds": round(max(certs), 3) if certs else None,
        "all_streams_seconds": round(max(served), 3) if served else None,
        "certificate_seconds": summary(certs),
        "stream_served_seconds": summary(served),
        "server_cpu_seconds": round(cpu_end - cpu, 3) if cpu_end is not None else None,
        "server_cpu_until_certificates_seconds": round(cpu_certs - cpu, 3) if cpu_certs is not None else None,
        "ready_probes": len(in_storm),
        "ready_failures": sum(1 for s in in_storm if s[1] is None or s[2] != 200),
        "ready_latency_seconds": summary(latencies),
        "ready_over_100ms": sum(1 for v in latencies if v > 0.1),
        "ready_slowest": [
            [round(at - started, 2), None if took is None else round(took, 4)]
            for at, took, _, _ in sorted(in_storm, key=lambda s: -(s[1] or 5.0))[:5]
        ],
    }
