"""Lease leader election against the emulated API server (409 on stale writes, as client-go relies on)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from support.kube_api import KubeApiServer

from meshpilot.kube.client import client_from_kubeconfig
from meshpilot.kube.leader import LeaderElector, LeaseTimings

pytestmark = pytest.mark.integration

FAST = LeaseTimings(lease_duration=1.0, renew_deadline=0.5, retry_period=0.1)


@pytest.fixture
def api() -> Iterator[KubeApiServer]:
    with KubeApiServer() as server:
        server.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "istio-system"}})
        yield server


class Replica:
    def __init__(self, api: KubeApiServer, tmp: Path, identity: str, timings: LeaseTimings = FAST) -> None:
        self.client = client_from_kubeconfig(api.write_kubeconfig(tmp / f"{identity}.kubeconfig"))
        self.led = 0
        self.stop = asyncio.Event()
        self.elector = LeaderElector(
            self.client, "istio-system", "istio-status-leader", self._lead, identity=identity, timings=timings
        )
        self.task = asyncio.create_task(self.elector.run(self.stop))

    async def _lead(self) -> None:
        self.led += 1
        await asyncio.Event().wait()

    async def close(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 5)
        self.client.close()


@pytest.fixture
async def replicas(api: KubeApiServer, tmp_path: Path) -> AsyncIterator[list[Replica]]:
    made: list[Replica] = []
    yield made
    for replica in made:
        if not replica.task.done():
            await replica.close()


def holder(api: KubeApiServer) -> str:
    lease = api.get("leases", "istio-system", "istio-status-leader") or {}
    return str(lease.get("spec", {}).get("holderIdentity", ""))


async def until(check, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_one_leader_and_a_clean_handover(
    api: KubeApiServer, tmp_path: Path, replicas: list[Replica]
) -> None:
    a = Replica(api, tmp_path, "a")
    replicas.append(a)
    await until(lambda: a.elector.leading)
    b = Replica(api, tmp_path, "b")
    replicas.append(b)
    await asyncio.sleep(1.5)  # longer than the lease: a renews, so b never takes it
    assert a.elector.leading and not b.elector.leading
    assert holder(api) == "a"
    assert a.led == 1 and b.led == 0
    lease = api.get("leases", "istio-system", "istio-status-leader")
    assert lease is not None and lease["spec"]["leaseDurationSeconds"] == 1
    # A clean stop releases the Lease: b takes over at its next try, well before the duration.
    await a.close()
    released = time.monotonic()
    await until(lambda: b.elector.leading)
    assert time.monotonic() - released < 0.8
    assert holder(api) == "b"
    final = api.get("leases", "istio-system", "istio-status-leader")
    assert final is not None and final["spec"]["leaseTransitions"] == 1


async def test_a_dead_holder_is_replaced_only_after_the_lease_duration(
    api: KubeApiServer, tmp_path: Path, replicas: list[Replica]
) -> None:
    api.apply(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "istio-status-leader", "namespace": "istio-system"},
            "spec": {
                "holderIdentity": "gone",
                "leaseDurationSeconds": 1,
                "renewTime": "2026-01-01T00:00:00.000000Z",
            },
        }
    )
    started = time.monotonic()
    a = Replica(api, tmp_path, "a")
    replicas.append(a)
    await until(lambda: a.elector.leading)
    # The record's time is never compared with our clock: we wait a full duration from first sight.
    assert time.monotonic() - started >= 1.0
    assert holder(api) == "a"


async def test_a_leader_cut_off_from_the_api_stops_leading(
    api: KubeApiServer, tmp_path: Path, replicas: list[Replica]
) -> None:
    # A lease far longer than the renew deadline: giving up late, after another replica may take
    # over, is told apart from giving up on time by more than a busy host's lag.
    timings = LeaseTimings(lease_duration=3.0, renew_deadline=0.5, retry_period=0.1)
    a = Replica(api, tmp_path, "a", timings)
    replicas.append(a)
    await until(lambda: a.elector.leading)
    api.stop_listening()
    cut = time.monotonic()
    await until(lambda: not a.elector.leading, timeout=5)
    # It gives up within the renew deadline of its last renewal (before the cut), plus a retry;
    # another replica waits the whole lease duration from its own sight of that renewal.
    assert time.monotonic() - cut < timings.lease_duration
    api.start_listening()
    await until(lambda: a.elector.leading, timeout=5)
    assert a.led == 2
