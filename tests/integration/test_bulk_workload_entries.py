"""5,000 WorkloadEntries in one file, selected by a few ServiceEntries: added and removed in about a second.

Issue 21 asked for registry costs linear in the number of objects. Each WorkloadEntry's event
recomputed its ServiceEntries' endpoints from every entry of the store, so a file of them cost the
square of its count (1,000 entries 1.9 s with the loop stalled 1.7 s, 2,000 entries 6.9 s and
5.3 s); a file is now applied in one store batch and each host's endpoints computed once at its end.
A server process, a canary proxy subscribed to the selected services' EDS, and the event loop's
longest stall seen as ``bench.bulk_config`` sees it (/version on the monitoring port).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from envoy.config.endpoint.v3 import endpoint_pb2
from support.ads_client import AdsClient
from support.kube import istio, workload, write
from support.processes import Meshpilot

from bench.bulk_config import LoopProbe

pytestmark = [pytest.mark.integration]

NODE = "sidecar~127.0.0.11~productpage-v1.default~default.svc.cluster.local"
CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
GROUPS = 5
COUNT = 5_000
CLUSTERS = [f"outbound|80||vm-{g}.example.com" for g in range(GROUPS)]
#: Each change's bound: about 0.7 s here (2 cores), the quadratic version about 40 s.
BOUND = 15.0


def selecting_entries() -> list[dict[str, object]]:
    return [
        istio(
            "ServiceEntry",
            f"vm-{g}",
            "default",
            {
                "hosts": [f"vm-{g}.example.com"],
                "location": "MESH_INTERNAL",
                "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
                "resolution": "STATIC",
                "workloadSelector": {"labels": {"app": f"vm-{g}"}},
            },
        )
        for g in range(GROUPS)
    ]


def workload_entries(count: int) -> list[dict[str, object]]:
    return [
        istio(
            "WorkloadEntry",
            f"we-{i}",
            "default",
            {
                "address": f"10.{100 + i // 65536}.{i // 256 % 256}.{i % 256}",
                "labels": {"app": f"vm-{i % GROUPS}"},
            },
        )
        for i in range(count)
    ]


async def _endpoints_pushed(client: AdsClient, want: int, timeout: float) -> None:
    """Until an EDS push holds ``want`` endpoints in all (ACKing every push meanwhile)."""
    deadline = time.monotonic() + timeout
    while True:
        response = await client.recv(max(0.01, deadline - time.monotonic()))
        client.ack(response, CLUSTERS if response.type_url == EDS else None)
        if response.type_url != EDS:
            continue
        loads = [endpoint_pb2.ClusterLoadAssignment.FromString(r.value) for r in response.resources]
        if sum(len(e.lb_endpoints) for load in loads for e in load.endpoints) == want:
            return


@pytest.mark.timeout(300)
async def test_a_file_of_workload_entries_is_added_and_removed_in_linear_time(tmp_path: Path) -> None:
    config = tmp_path / "config"
    apps = workload("productpage", "default", "10.96.0.10", 9080, {"productpage-v1": "127.0.0.11"})
    write(config / "apps.yaml", [*apps, *selecting_entries()])
    staged = write(tmp_path / "workload-entries.yaml", workload_entries(COUNT))
    mp = Meshpilot(tmp_path, config)
    mp.start()
    client: AdsClient | None = None
    probe = LoopProbe(lambda: mp.get("/version", mp.monitoring_port))
    try:
        await asyncio.to_thread(mp.wait_ready)
        client = AdsClient(f"127.0.0.1:{mp.grpc_port}")
        client.send(CDS, node_id=NODE)
        client.ack(await client.recv())
        client.send(EDS, CLUSTERS)
        await _endpoints_pushed(client, 0, 10)
        probe.start()
        for change, want in (("add", COUNT), ("remove", 0)):
            probe.reset()
            started = time.monotonic()
            if change == "add":
                staged.replace(config / "workload-entries.yaml")
            else:
                (config / "workload-entries.yaml").unlink()
            await _endpoints_pushed(client, want, 120)
            took = time.monotonic() - started
            await asyncio.sleep(0.5)
            print(f"{COUNT} WorkloadEntries, {change}: EDS push {took:.2f} s, loop stall {probe.stall:.2f} s")
            assert took < BOUND, f"{change}: {took:.1f} s"
            assert probe.stall < BOUND / 3, f"{change}: the loop stalled {probe.stall:.1f} s"
            assert mp.get("/ready")[0] == 200
    finally:
        probe.stop()
        if client is not None:
            await client.close()
        mp.stop()
