"""Real capture: `meshpilot iptables` rules in a network namespace, a REDIRECT-mode Envoy and an app.

Two namespaces joined by a veth pair stand in for a pod and the rest of the cluster:

- pod (10.250.0.2): the rules, Envoy as uid 1337, the app as uid 1000 on ports 9080
  (captured inbound) and 9090 (excluded with -d), and `meshpilot discovery` on 127.0.0.1
  (its traffic to Envoy and back is loopback, which the rules leave alone);
- cluster (10.250.0.1): the reviews backends v1 (10.250.0.11) and v2 (10.250.0.12) and
  the client that calls into the pod.

The Service VIP 10.96.0.20 exists on no interface: only capture to 15001 and Envoy's
routing can make a plain request to it succeed.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import certs
from support.kube import istio, workload, write
from support.netns import NetworkNamespace, veth
from support.processes import Envoy, Meshpilot, Process, Sds, free_port, sidecar_bootstrap
from support.wait import eventually

pytestmark = [pytest.mark.envoy, pytest.mark.integration]

APP_UID = 1000
PROXY_UID = 1337
POD_IP = "10.250.0.2"
ECHO = str(Path(__file__).parent / "echo_server.py")
CAPTURE_FLAGS = ["-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT", "-i", "*", "-x", ""]
CAPTURE_FLAGS += ["-b", "*", "-d", "9090"]


class Pod:
    """The namespaces, processes and files of one test; `close` undoes all of it."""

    def __init__(self) -> None:
        # Envoy runs as uid 1337 and must read its bootstrap and reach the SDS socket,
        # so the work directory is world-readable (pytest's tmp_path is not).
        self.work = Path(tempfile.mkdtemp(prefix="meshpilot-capture-"))
        self.work.chmod(0o755)
        self.pod = NetworkNamespace("mp-pod")
        self.cluster = NetworkNamespace("mp-cl")
        self.processes: list[Process] = []

    def start(self, process: Process, ns: NetworkNamespace | None, uid: int | None = None) -> Process:
        if ns is not None:
            process.argv = [*ns.prefix(uid), *process.argv]
        self.processes.append(process)
        process.start()
        return process

    def curl(self, ns: NetworkNamespace, url: str, uid: int | None = None) -> dict[str, Any]:
        done = ns.run(["curl", "-sS", "--max-time", "5", url], uid=uid, check=False, timeout=15)
        assert done.returncode == 0, f"curl {url} in {ns.name}: {done.stderr}"
        body: dict[str, Any] = json.loads(done.stdout)
        return body

    def admin(self, envoy: Envoy, path: str) -> str:
        # Envoy's admin port is on the pod's loopback; root's traffic there is not captured.
        done = self.pod.run(["curl", "-sS", "--max-time", "5", f"http://127.0.0.1:{envoy.admin_port}{path}"])
        return done.stdout

    def stats(self, envoy: Envoy) -> dict[str, int]:
        out = {}
        for line in self.admin(envoy, "/stats").splitlines():
            key, sep, value = line.rpartition(": ")
            if sep and value.strip().isdigit():
                out[key] = int(value)
        return out

    def logs(self) -> str:
        return "\n".join(f"===== {p.name} =====\n{p.log()[-4000:]}" for p in self.processes)

    def close(self) -> None:
        for process in reversed(self.processes):
            process.stop(timeout=5)
        self.pod.delete()
        self.cluster.delete()
        shutil.rmtree(self.work, ignore_errors=True)


@pytest.fixture
def pod() -> Iterator[Pod]:
    p = Pod()
    failed = True
    try:
        p.pod.create()
        p.cluster.create()
        veth(p.pod, f"{POD_IP}/24", p.cluster, ["10.250.0.1/24", "10.250.0.11/24", "10.250.0.12/24"])
        # A pod routes everything off-node through its interface, VIPs included.
        p.pod.ip("route", "add", "default", "via", "10.250.0.1")
        yield p
        failed = False
    finally:
        if failed:
            print(p.logs())
        p.close()


def _mesh_config(config_dir: Path) -> None:
    write(
        config_dir / "apps.yaml",
        [
            *workload(
                "reviews", "default", "10.96.0.20", 9080,
                {"reviews-v1": "10.250.0.11", "reviews-v2": "10.250.0.12"},
                versions={"reviews-v1": "v1", "reviews-v2": "v2"},
            ),
            *workload("productpage", "default", "10.96.0.10", 9080, {"productpage-v1": POD_IP}),
            istio(
                "DestinationRule", "reviews", "default",
                {"host": "reviews", "subsets": [{"name": "v1", "labels": {"version": "v1"}},
                                                {"name": "v2", "labels": {"version": "v2"}}]},
            ),
            istio(
                "VirtualService", "reviews", "default",
                {"hosts": ["reviews"],
                 "http": [{"route": [{"destination": {"host": "reviews", "subset": "v2"}}]}]},
            ),
        ],
    )  # fmt: skip


def test_capture_in_network_namespace(pod: Pod) -> None:
    # 1. The rules, applied for real inside the pod namespace by the CLI.
    pod.pod.run([sys.executable, "-m", "meshpilot.cli.main", "iptables", *CAPTURE_FLAGS])
    saved = pod.pod.run(["iptables-save", "-t", "nat"]).stdout
    for chain in ("ISTIO_INBOUND", "ISTIO_IN_REDIRECT", "ISTIO_REDIRECT", "ISTIO_OUTPUT"):
        assert f":{chain} " in saved
    assert "--dport 9090 -j RETURN" in saved

    # 2. Backends in the cluster namespace, the app in the pod as its own uid.
    for name, ip in (("reviews-v1", "10.250.0.11"), ("reviews-v2", "10.250.0.12")):
        pod.start(
            Process(name, [sys.executable, ECHO, name, ip, "9080"], pod.work / f"{name}.log"), pod.cluster
        )
    app = Process(
        "productpage", [sys.executable, ECHO, "productpage", "0.0.0.0", "9080", "9090"], pod.work / "app.log"
    )
    pod.start(app, pod.pod, APP_UID)

    # 3. meshpilot inside the pod namespace, SDS on a unix socket, Envoy as uid 1337.
    config_dir = pod.work / "config"
    _mesh_config(config_dir)
    mp = Meshpilot(pod.work, config_dir)
    pod.start(mp, pod.pod)
    ready_url = f"http://127.0.0.1:{mp.http_port}/ready"
    eventually(
        lambda: pod.pod.run(["curl", "-sf", ready_url], check=False).returncode == 0,
        timeout=30,
        what="meshpilot /ready in the pod namespace",
    )
    credentials = certs.TestCA().issue("spiffe://cluster.local/ns/default/sa/productpage", pod.work / "certs")
    sds = Sds(pod.work, "productpage", credentials)
    pod.start(sds, None)
    sds.wait_listening()
    sds.socket.chmod(0o666)
    admin = free_port()
    bootstrap = sidecar_bootstrap(
        node_id=f"sidecar~{POD_IP}~productpage-v1.default~default.svc.cluster.local",
        metadata={
            "NAMESPACE": "default", "INTERCEPTION_MODE": "REDIRECT", "CLUSTER_ID": "Kubernetes",
            "ISTIO_VERSION": "1.28.0", "LABELS": {"app": "productpage"},
        },
        admin_port=admin, xds_port=mp.grpc_port, sds_socket=sds.socket,
    )  # fmt: skip
    envoy = Envoy(pod.work, "productpage", bootstrap, admin)
    pod.start(envoy, pod.pod, PROXY_UID)

    def ready() -> bool:
        stats = pod.stats(envoy)
        return (
            "listener.0.0.0.0_15001.downstream_cx_total" in stats
            and "listener.0.0.0.0_15006.downstream_cx_total" in stats
            and stats.get("listener_manager.total_listeners_warming", 1) == 0
            and stats.get("cluster_manager.warming_clusters", 1) == 0
        )

    eventually(ready, timeout=60, interval=0.5, what="Envoy with virtualOutbound and virtualInbound active")
    before = pod.stats(envoy)
    assert {k: v for k, v in before.items() if k.endswith("update_rejected") and v} == {}

    # 4. Outbound: the app's plain request to the VIP is captured to 15001 and routed per the VirtualService.
    for _ in range(4):
        seen = pod.curl(pod.pod, "http://10.96.0.20:9080/", uid=APP_UID)
        assert seen["name"] == "reviews-v2"
        assert seen["peer"] == POD_IP
        assert "x-request-id" in seen["headers"]  # added by Envoy's HTTP connection manager
    after_out = pod.stats(envoy)
    # 0.0.0.0_9080 binds no port in REDIRECT mode: only virtualOutbound's original-destination
    # hand-off (the connection arriving on 15001) can bring connections to it.
    out_key = "listener.0.0.0.0_9080.downstream_cx_total"
    assert after_out[out_key] >= before.get(out_key, 0) + 4
    # Istio's alt_stat_name ends in ';' (its tag extractor's delimiter).
    subset_rq = "cluster.outbound|9080|{}|reviews.default.svc.cluster.local;.upstream_rq_total"
    assert after_out[subset_rq.format("v2")] >= 4
    assert after_out[subset_rq.format("v1")] == 0

    # 5. Inbound: a call into the pod on 9080 is captured to 15006 and reaches the app through Envoy.
    seen = pod.curl(pod.cluster, f"http://{POD_IP}:9080/")
    assert seen["name"] == "productpage" and seen["port"] == 9080
    assert seen["peer"] != "10.250.0.1"  # Envoy's inbound side, not the caller, connected to the app
    assert "x-request-id" in seen["headers"]
    after_in = pod.stats(envoy)
    in_key = "listener.0.0.0.0_15006.downstream_cx_total"
    assert after_in[in_key] == after_out[in_key] + 1

    # 6. Excluded inbound port 9090: the app answers the caller directly, Envoy never sees it.
    seen = pod.curl(pod.cluster, f"http://{POD_IP}:9090/")
    assert seen["name"] == "productpage" and seen["port"] == 9090
    assert seen["peer"] == "10.250.0.1"
    assert "x-request-id" not in seen["headers"]
    assert pod.stats(envoy)[in_key] == after_in[in_key]

    # 7. Cleanup with the same flags removes every ISTIO chain and jump.
    pod.pod.run([sys.executable, "-m", "meshpilot.cli.main", "iptables", "clean", *CAPTURE_FLAGS])
    saved = pod.pod.run(["iptables-save"]).stdout
    assert "ISTIO" not in saved, saved
