"""Debug pages, istioctl's debug types and /metrics of a server with two push workers (issue 20):
each sees every proxy, whichever worker holds its stream.

The proxies are ADS streams, each on a TCP connection of its own (the kernel's SO_REUSEPORT picks a
worker per connection); which worker took each is read from the kernel (``pool_fetch``), and enough
are opened that every worker holds some and none holds all. So a page or a count that showed one
worker's streams only would miss some, whichever worker answered.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from google.protobuf import any_pb2
from support.ads_client import AdsClient, DeltaClient
from support.istioctl import Istioctl, mesh_certs
from support.pool_fetch import ServerSockets
from support.processes import Meshpilot, free_port
from support.wait import eventually

from meshpilot import __version__
from meshpilot.xds.types import TypeUrl

pytestmark = [pytest.mark.integration, pytest.mark.reference, pytest.mark.timeout(120)]

WORKERS = 2
ISTIOD_POD = "istiod-pool-0"
#: Each worker holds at least this many proxies.
PER_WORKER = 2
#: At least this many proxies in all; at most ``MAX_PROXIES`` tried to reach ``PER_WORKER``.
PROXIES = 6
MAX_PROXIES = 24
METADATA = {
    "ISTIO_VERSION": "1.28.0",
    "NAMESPACE": "default",
    # What Istio's agent sends; the sync status lists only such nodes.
    "PROXY_CONFIG": {"discoveryAddress": "istiod.istio-system.svc:15012"},
}


@dataclass
class Proxy:
    id: str
    client: AdsClient | DeltaClient
    #: The server process holding the stream.
    worker: int


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Meshpilot, int]]:
    """meshpilot with two push workers, and the client-certificate port istioctl's secure calls use."""
    work = tmp_path_factory.mktemp("pool-debug")
    cert_port = free_port()
    mp = Meshpilot(
        work,
        Path("examples/config"),
        mesh_config=Path("examples/mesh.yaml"),
        extra=[
            "--push-workers",
            str(WORKERS),
            "--secure-grpc-client-cert-addr",
            f"127.0.0.1:{cert_port}",
            # Sync status and config dumps on the plaintext port, as istiod serves them so.
            "--no-debug-endpoint-auth",
        ],
        env={"POD_NAME": ISTIOD_POD},
    )
    mp.start()
    try:
        mp.wait_ready(60)
        yield mp, cert_port
    finally:
        code = mp.stop()
        if code not in (0, None):
            print(mp.log()[-5000:])


async def _connect(mp: Meshpilot, index: int) -> Proxy:
    """A proxy that asked for clusters and listeners and acknowledged both (SotW and delta in turn)."""
    assert mp.proc is not None
    node_id = f"sidecar~10.0.0.{index}~p{index}.default~default.svc.cluster.local"
    target = f"127.0.0.1:{mp.grpc_port}"
    before = ServerSockets.read(mp.proc.pid, mp.grpc_port)
    delta = index % 2 == 1
    client: AdsClient | DeltaClient = (
        DeltaClient(target, own_connection=True) if delta else AdsClient(target, own_connection=True)
    )
    for type_url in (TypeUrl.CLUSTER, TypeUrl.LISTENER):
        client.send(type_url.value, node_id=node_id, node_metadata=METADATA)
        response = await client.recv(10)
        assert response.type_url == type_url.value
        client.ack(response)
    [worker] = ServerSockets.read(mp.proc.pid, mp.grpc_port).taken_since(before)
    return Proxy(f"p{index}.default", client, worker)


@pytest.fixture
async def proxies(server: tuple[Meshpilot, int]) -> AsyncIterator[list[Proxy]]:
    """Proxies until each worker holds ``PER_WORKER`` (the kernel decides which worker gets one)."""
    mp, _ = server
    assert mp.proc is not None
    workers = ServerSockets.read(mp.proc.pid, mp.grpc_port).listening
    assert len(workers) == WORKERS, f"expected {WORKERS} processes on the xDS port, saw {workers}"
    held: list[Proxy] = []
    try:
        while len(held) < PROXIES or any(sum(p.worker == w for p in held) < PER_WORKER for w in workers):
            assert len(held) < MAX_PROXIES, f"the kernel sent {MAX_PROXIES} connections to one worker"
            held.append(await _connect(mp, len(held)))
        # Wait for the acknowledgements to be recorded on the workers.
        await asyncio.to_thread(_synced, mp, {p.id for p in held})
        yield held
    finally:
        for proxy in held:
            await proxy.client.close()


def _synced(mp: Meshpilot, wanted: set[str]) -> None:
    def check() -> bool:
        rows = mp.get_json("/debug/syncz")
        return {r["proxy"] for r in rows if r.get("cluster_acked") and r.get("listener_acked")} == wanted

    eventually(check, timeout=10, what="every proxy acknowledged in /debug/syncz")


def _convergences(mp: Meshpilot) -> float:
    return mp.metric("pilot_proxy_convergence_time_count")


async def test_http_debug_pages_and_metrics_cover_every_worker(
    server: tuple[Meshpilot, int], proxies: list[Proxy]
) -> None:
    mp, _ = server
    ids = {p.id for p in proxies}
    by_worker = {w: {p.id for p in proxies if p.worker == w} for w in {p.worker for p in proxies}}
    assert len(by_worker) == WORKERS and all(0 < len(v) < len(ids) for v in by_worker.values()), by_worker

    syncz = mp.get_json("/debug/syncz")
    assert sorted(r["proxy"] for r in syncz) == sorted(ids)
    assert all(r["cluster_sent"] == r["cluster_acked"] for r in syncz)

    connections = mp.get_json("/debug/connections")
    assert connections["totalClients"] == len(ids)
    conn_ids = [c["connectionId"] for c in connections["clients"]]
    assert conn_ids == sorted(conn_ids)
    assert {c.rpartition("-")[0] for c in conn_ids} == ids

    adsz = mp.get_json("/debug/adsz")
    assert adsz["totalClients"] == len(ids)
    assert {c["connectionId"] for c in adsz["clients"]} == set(conn_ids)
    assert all(TypeUrl.CLUSTER.value in c["watches"] for c in adsz["clients"])
    only = mp.get_json(f"/debug/adsz?proxyID={proxies[0].id}-")
    assert [c["connectionId"].rpartition("-")[0] for c in only["clients"]] == [proxies[0].id]

    # A config dump of a proxy on each worker, and the answers for a proxy nobody holds.
    for held in by_worker.values():
        proxy_id = min(held)
        dump = mp.get_json(f"/debug/config_dump?proxyID={proxy_id}")
        kinds = {c["@type"].rpartition(".")[2] for c in dump["configs"]}
        assert {"ClustersConfigDump", "ListenersConfigDump"} <= kinds
    status, body = mp.get("/debug/config_dump?proxyID=nobody.nowhere")
    assert status == 404 and b"Proxy not connected" in body
    assert mp.get("/debug/config_dump")[0] == 400

    # /metrics: streams summed over the workers; the model's gauges and the build once; each
    # process's own figures apart.
    metrics = mp.metrics()
    assert metrics['pilot_xds{version="1.28.0"}'] == len(ids)
    assert metrics[f'istio_build{{component="pilot",tag="{__version__}"}}'] == 1
    registry = mp.get_json("/debug/registryz")
    assert metrics["pilot_services"] == len(registry)
    for worker in range(WORKERS):
        assert f'process_cpu_seconds_total{{push_worker="{worker}"}}' in metrics
    assert "process_cpu_seconds_total" in metrics  # the main process's own

    # adsz?push=true: the main process's debounce starts it and every worker pushes its proxies.
    before = _convergences(mp)
    status, _ = mp.get("/debug/adsz?push=true")
    assert status == 200
    eventually(
        lambda: _convergences(mp) >= before + len(ids),
        timeout=10,
        what="a push to every proxy of both workers",
    )


def _table(output: str) -> dict[str, dict[str, str]]:
    """istioctl's table (columns aligned, cells may be empty): a row per proxy, by name, its cells by
    column header."""
    header, *lines = [line for line in output.splitlines() if line.strip()]
    starts = [m.start() for m in re.finditer(r"(?:^|(?<=\s\s))\S", header)]
    bounds = list(zip(starts, [*starts[1:], None], strict=True))
    rows = [{header[a:b].strip(): line[a:b].strip() for a, b in bounds} for line in lines]
    return {row["NAME"]: row for row in rows}


class DebugStream:
    """istioctl's kind of stream: debug requests, answered by the worker that took the connection."""

    def __init__(self, mp: Meshpilot) -> None:
        self.mp = mp
        self.client = AdsClient(f"127.0.0.1:{mp.grpc_port}", own_connection=True)
        self.worker = 0
        self._node: str | None = "sidecar~10.0.0.200~istioctl.istio-system~istio-system.svc.cluster.local"

    async def ask(self, type_url: TypeUrl, names: list[str]) -> list[any_pb2.Any]:
        mp = self.mp
        assert mp.proc is not None
        before = ServerSockets.read(mp.proc.pid, mp.grpc_port) if self._node else None
        self.client.send(type_url.value, names, node_id=self._node)
        response = await self.client.recv(10)
        if before is not None:
            [self.worker] = ServerSockets.read(mp.proc.pid, mp.grpc_port).taken_since(before)
        self._node = None
        return list(response.resources)


async def test_istioctl_and_the_debug_types_see_every_worker(
    server: tuple[Meshpilot, int], proxies: list[Proxy], tmp_path: Path
) -> None:
    mp, cert_port = server
    ids = {p.id for p in proxies}
    istioctl = Istioctl(tmp_path, mp, mesh_certs(mp, tmp_path / "istioctl-certs"), cert_port)

    # Each run is a new connection to whichever worker the kernel picks; each lists every proxy.
    for _ in range(3):
        rows = _table(await asyncio.to_thread(istioctl.run, "proxy-status", "-v", "1"))
        assert set(rows) == ids
        for row in rows.values():
            assert row["CDS"].startswith("SYNCED") and row["LDS"].startswith("SYNCED"), row
            assert (row["ISTIOD"], row["VERSION"]) == (ISTIOD_POD, "1.28.0")

    # The debug page type (secure port, with a mesh identity): the pool's pages.
    syncz = json.loads(await asyncio.to_thread(istioctl.run, "x", "internal-debug", "syncz", secure=True))
    assert {s["proxy"] for s in syncz} >= ids  # with istioctl's own stream
    connections = json.loads(
        await asyncio.to_thread(istioctl.run, "x", "internal-debug", "connections", secure=True)
    )
    # Every proxy, and istioctl's own stream.
    assert {c["connectionId"].rpartition("-")[0] for c in connections["clients"]} >= ids
    assert connections["totalClients"] == len(connections["clients"]) > len(ids)

    # The sync status and a config dump, from the worker that holds neither all the proxies nor the
    # one dumped.
    stream = DebugStream(mp)
    try:
        synced = await stream.ask(TypeUrl.DEBUG_SYNCZ, [])
        assert len(synced) == len(ids)
        other = next(p for p in proxies if p.worker != stream.worker)
        dump = await stream.ask(TypeUrl.DEBUG_CONFIG_DUMP, [other.id])
    finally:
        await stream.client.close()
    types = {section.type_url for section in dump}
    assert {
        "type.googleapis.com/envoy.admin.v3.ClustersConfigDump",
        "type.googleapis.com/envoy.admin.v3.ListenersConfigDump",
    } <= types, types
