"""Listing and indexing a large cluster from the Kubernetes API: ``python -m bench.kube_sync``.

An emulated API server (the test tree's kmock-based emulator, the only API
server that runs here) is started in a child process holding N pods, their
Services and one EndpointSlice per Service, so its CPU is not this
process's. This process then runs meshpilot's own startup path against it:
the Kubernetes controller lists every kind, decodes each object with the
config loader, applies it to the registry, fills the EndpointIndex, and the
discovery server builds its first snapshot. Measured side by side in one run:

* the raw list of the pods (HTTP, JSON parse) with the official client, the
  floor any client pays for this data;
* the time until every informer has synced, and until ready (first snapshot);
* this process's RSS before and after (the cost of holding the cluster).

Results go to ``bench/results/kube.json``; ``bench.report`` shows them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "kube.json"


def cluster_objects(pods: int, services: int) -> list[dict[str, Any]]:
    """``services`` Services in 10 namespaces, ``pods`` Pods spread over them, one EndpointSlice each."""
    out: list[dict[str, Any]] = []
    namespaces = [f"ns-{i}" for i in range(10)]
    out += [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}} for ns in namespaces]
    out += [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": f"node-{i}", "labels": {"topology.kubernetes.io/zone": f"z{i % 3}"}},
        }
        for i in range(20)
    ]
    per_service = max(1, pods // services)
    for s in range(services):
        ns, name = namespaces[s % len(namespaces)], f"svc-{s}"
        labels = {"app": name}
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": name, "namespace": ns},
                "spec": {
                    "clusterIP": f"10.{96 + s // 65536}.{(s // 256) % 256}.{s % 256}",
                    "selector": labels,
                    "ports": [{"name": "http", "port": 80, "targetPort": 8080}],
                },
            }
        )
        endpoints = []
        for p in range(per_service):
            index = s * per_service + p
            ip = f"10.{index // 65536 % 256}.{index // 256 % 256}.{index % 256 or 1}"
            pod_name = f"{name}-{p}"
            out.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": pod_name,
                        "namespace": ns,
                        "labels": {**labels, "security.istio.io/tlsMode": "istio"},
                    },
                    "spec": {
                        "serviceAccountName": name,
                        "nodeName": f"node-{index % 20}",
                        "containers": [{"name": "app"}],
                    },
                    "status": {"podIP": ip, "phase": "Running"},
                }
            )
            endpoints.append(
                {
                    "addresses": [ip],
                    "conditions": {"ready": True},
                    "targetRef": {"kind": "Pod", "name": pod_name, "namespace": ns},
                }
            )
        out.append(
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": f"{name}-1",
                    "namespace": ns,
                    "labels": {"kubernetes.io/service-name": name},
                },
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                "endpoints": endpoints,
            }
        )
    return out


def serve(pods: int, services: int) -> None:
    """Child process: the emulated API server, loaded; prints its port and serves until stdin closes."""
    sys.path.insert(0, str(ROOT / "tests"))
    from support.kube_api import KubeApiServer  # type: ignore[import-not-found]

    with KubeApiServer() as api:
        for obj in cluster_objects(pods, services):
            api.apply(obj)
        print(api.port, flush=True)
        sys.stdin.read()


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


async def measure(port: int, workdir: Path) -> dict[str, Any]:
    from meshpilot.kube.client import client_from_kubeconfig, request_json
    from meshpilot.server.app import DiscoveryApp
    from meshpilot.server.settings import DiscoverySettings

    kubeconfig = workdir / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {}}]\n"
    )
    client = client_from_kubeconfig(kubeconfig)
    started = time.perf_counter()
    listed = await asyncio.to_thread(request_json, client, "GET", "/api/v1/pods", timeout=(5.0, 300.0))
    raw_list = time.perf_counter() - started
    count = len(listed["items"])
    del listed
    client.close()  # type: ignore[no-untyped-call]

    rss_before = _rss_mib()
    settings = DiscoverySettings(kubeconfig=kubeconfig, use_kube=True, webhook_addr=None)
    app = DiscoveryApp(settings)
    assert app.kube_controller is not None
    started = time.perf_counter()
    app.kube_controller.start()
    await app.kube_controller.wait_synced()
    synced = time.perf_counter() - started
    app.server.start_serving()
    ready = time.perf_counter() - started
    rss_after = _rss_mib()
    services = len(app.registry.services())
    endpoints = sum(len(eps) for _, _, shards in app.index.services() for eps in shards.shards.values())
    await app.kube_controller.stop()
    return {
        "pods_listed": count,
        "services": services,
        "endpoints_indexed": endpoints,
        "raw_pod_list_seconds": round(raw_list, 3),
        "synced_seconds": round(synced, 3),
        "ready_seconds": round(ready, 3),
        "rss_before_mib": round(rss_before, 1),
        "rss_after_mib": round(rss_after, 1),
        "rss_growth_mib": round(rss_after - rss_before, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def run(pods: int, services: int, workdir: Path) -> dict[str, Any]:
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.kube_sync",
            "--serve",
            "--pods",
            str(pods),
            "--services",
            str(services),
        ],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        started = time.perf_counter()
        port = int(child.stdout.readline())
        load = time.perf_counter() - started
        result = asyncio.run(measure(port, workdir))
    finally:
        if child.stdin is not None:
            child.stdin.close()
        child.wait(30)
        if child.stdout is not None:
            child.stdout.close()
    return {"pods": pods, "services_requested": services, "emulator_load_seconds": round(load, 1), **result}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--services", type=int, default=1_000)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.pods, args.services)
        return 0
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        result = run(args.pods, args.services, Path(tmp))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    result["machine"] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "commit": commit.stdout.strip() or "?",
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
