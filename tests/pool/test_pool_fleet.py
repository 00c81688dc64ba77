"""A fleet of simulated sidecars over a server with two push workers (issue 20, "Shown").

The sidecars are the benchmark's simulator (``bench.fleet``: Envoy's order of subscriptions, an ACK
for every response, Envoy's reconnect backoff; over delta, ``bench.fleet_delta``: wildcard CDS and
LDS, EDS and RDS by name, a reconnect resuming with the versions held), each on its own HTTP/2
connection, all of them watched response by response here: no version of a type (``version_info``,
delta's ``system_version_info``) may ever be older than one the proxy already received, on any
stream, and no proxy may be left with no clusters or no listeners once it had some. Which worker
holds a stream is read from the kernel: the server end of each connection is a socket one worker
process has open.

The kernel spreads connections over the workers' SO_REUSEPORT sockets by a hash of each connection's
addresses, so each worker's share is binomial: with 200 connections one run in seven lands outside
10% of even (measured: 4 of 30 runs of 200 loopback connections over two sockets). The fleet here
has 1,000 streams, where 10% of even is about three standard deviations.

/ready is polled from a process of its own through the storm and the kill. Its bound, 100 ms, is
held at the 95th percentile; the few probes over it (0-4 of about 200 a run, up to 0.34 s) come from
the machine, not the main process: on this 2-core machine shared with other test runs (load average
3-10) an idle asyncio HTTP server polled the same way also took over 100 ms once or twice a run, and
the main process used 6% of a core through the storm (/ready is answered on a thread of its own). No
probe may take a second (a kubelet probe's default timeout) or fail. The simulator runs at a lower
priority than the server (it stands for sidecars on other machines), so that the cores it shares go
to the server first."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from envoy.service.discovery.v3 import discovery_pb2
from support.processes import Meshpilot

from bench.fleet import Worker
from bench.fleet_delta import DeltaProxy
from bench.pool_bench import streams_by_process
from bench.scenario import Scenario, write_yaml
from bench.sidecar import CDS, EDS, LDS, PROTOCOLS, RDS, ProxySpec, SimProxy
from bench.wirescan import scan_response

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

WORKERS = 2
STREAMS = 1000
#: The issue's bound on each worker's share of the streams.
SPLIT_TOLERANCE = 0.10
#: Pushes while a worker is killed: a change this often, for this long, the kill this far in.
STORM_INTERVAL = 0.05
STORM_SECONDS = 6.0
KILL_AFTER = 2.0
#: /ready's bound at the 95th percentile, and the longest any probe may take (a kubelet probe's
#: default timeout is 1 s).
READY_LIMIT = 0.1
READY_STALL = 1.0
#: The mesh: a few services with a VirtualService each; the sidecars are clients outside them, so
#: the config stays small however many there are.
MESH = Scenario("pool-fleet", services=8, endpoints_per_service=2, proxies=8, virtual_services=8)
STARTED = re.compile(r"push worker (\d+) started \(pid (\d+)\)")
SERVING = re.compile(r"push worker (\d+) serving$", re.MULTILINE)

#: Polls /ready of the main process until its stdin closes, then prints (time, seconds, status).
READY_POLLER = r"""
import http.client, json, sys, threading, time
port, samples, stop = int(sys.argv[1]), [], threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
while not stop.is_set():
    started = time.perf_counter()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/ready")
        response = conn.getresponse()
        response.read()
        status = response.status
        conn.close()
    except OSError:
        status = 0
    samples.append((time.time(), time.perf_counter() - started, status))
    stop.wait(0.02)
print(json.dumps(samples))
"""


def version_key(version: str) -> tuple[int, int]:
    """A push version's order: the main process's counter, then a worker's own pushes after it."""
    counter = version.rpartition("/")[2]
    main, _, local = counter.partition("+")
    return int(main), int(local or 0)


@dataclass
class Watch:
    """What one proxy was sent, over all its streams: the newest version of each type, any version
    older than one before it, and any clusters or listeners taken away once it had some."""

    #: By type: the newest version received (key, text).
    newest: dict[str, tuple[tuple[int, int], str]] = field(default_factory=dict)
    backwards: list[str] = field(default_factory=list)
    emptied: list[str] = field(default_factory=list)
    #: Types (clusters, listeners) the proxy has held resources of.
    had: set[str] = field(default_factory=set)

    def saw(self, type_url: str, version: str, holds_some: bool, stream: int) -> None:
        key = version_key(version)
        before = self.newest.get(type_url)
        if before is not None and key < before[0]:
            self.backwards.append(f"{type_url.rsplit('.', 1)[1]}: {before[1]} then {version}")
        if before is None or key > before[0]:
            self.newest[type_url] = (key, version)
        if type_url in (CDS, LDS):
            if holds_some:
                self.had.add(type_url)
            elif type_url in self.had:
                self.emptied.append(f"{type_url.rsplit('.', 1)[1]} at {version} (stream {stream})")


@dataclass
class WatchedProxy(SimProxy):
    """A simulated state-of-the-world sidecar that checks every response it receives."""

    watch: Watch = field(default_factory=Watch)
    #: By type: the last response's bytes (each carries all the proxy holds of the type).
    last: dict[str, bytes] = field(default_factory=dict)

    def saw(self, type_url: str, data: bytes, now: float) -> None:
        super().saw(type_url, data, now)
        version, _, _, resources = scan_response(data)
        self.watch.saw(type_url, version, bool(resources), self.connects)
        self.last[type_url] = data

    def holds(self, type_url: str, marker: bytes) -> bool:
        return marker in self.last.get(type_url, b"")


@dataclass
class WatchedDeltaProxy(DeltaProxy):
    """A simulated delta sidecar that checks every response it receives (``system_version_info``
    is the push's version; what it holds is what came, less what was removed)."""

    watch: Watch = field(default_factory=Watch)
    #: By type: each resource's bytes, by name.
    contents: dict[str, dict[str, bytes]] = field(default_factory=dict)

    def saw(self, type_url: str, data: bytes, now: float) -> None:
        super().saw(type_url, data, now)
        response = discovery_pb2.DeltaDiscoveryResponse.FromString(data)
        contents = self.contents.setdefault(type_url, {})
        for resource in response.resources:
            contents[resource.name] = resource.resource.value
        for name in response.removed_resources:
            contents.pop(name, None)
        # ``held`` (the simulator's own record) already has this response applied.
        self.watch.saw(type_url, response.system_version_info, bool(self.held.get(type_url)), self.connects)

    def holds(self, type_url: str, marker: bytes) -> bool:
        return any(marker in value for value in self.contents.get(type_url, {}).values())


Watched = WatchedProxy | WatchedDeltaProxy


def client_specs(count: int) -> list[ProxySpec]:
    """Sidecars of client workloads in the mesh's namespace, each with its own address."""
    namespace = MESH.namespace(0)
    specs = []
    for i in range(count):
        ip = f"10.64.{i // 250}.{i % 250 + 1}"
        metadata = {
            "NAMESPACE": namespace,
            "LABELS": {"app": "client"},
            "ISTIO_VERSION": "1.28.0",
            "CLUSTER_ID": "Kubernetes",
            "INSTANCE_IPS": ip,
        }
        specs.append(
            ProxySpec(f"sidecar~{ip}~client-{i}.{namespace}~{namespace}.svc.cluster.local", metadata)
        )
    return specs


def worker_pids(server: Meshpilot) -> dict[int, int]:
    """Each worker's current process, from the main process's log."""
    return {int(index): int(pid) for index, pid in STARTED.findall(server.log())}


async def until(check: Callable[[], bool], timeout: float, what: Callable[[], str]) -> float:
    """Seconds until ``check()`` holds; fails with ``what()`` after ``timeout``."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not within {timeout} s: {what()}")
        await asyncio.sleep(0.2)
    return time.monotonic() - started


async def converge(proxies: list[Watched], type_url: str, marker: bytes, timeout: float = 90) -> float:
    """Every proxy holds ``marker`` in a resource of ``type_url``, and all at one version."""

    def lagging() -> list[Watched]:
        return [p for p in proxies if not p.holds(type_url, marker)]

    took = await until(
        lambda: not lagging(),
        timeout,
        lambda: f"{len(lagging())} proxies lack {marker!r}, e.g. {lagging()[0].spec.node_id}",
    )
    versions = {p.watch.newest[type_url][1] for p in proxies}
    assert len(versions) == 1, f"after {marker!r} the proxies hold {sorted(versions)}"
    return took


def check_responses(proxies: list[Watched]) -> None:
    backwards = {p.spec.node_id: p.watch.backwards for p in proxies if p.watch.backwards}
    assert not backwards, f"versions went backwards: {dict(list(backwards.items())[:5])}"
    emptied = {p.spec.node_id: p.watch.emptied for p in proxies if p.watch.emptied}
    assert not emptied, f"empty configs after a full one: {dict(list(emptied.items())[:5])}"


def change_route(config: Path, marker: str) -> bytes:
    write_yaml(config / MESH.virtual_service_file(0), [MESH.virtual_service(0, marker=marker)])
    return f"bench-{marker}".encode()


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_fleet_over_two_workers(tmp_path: Path, protocol: str) -> None:
    """Streams split evenly; every change converges everywhere; a worker killed in a push storm
    loses no proxy, empties none, never serves an older version, and is started again. Over
    state-of-the-world and over delta (whose reconnects resume with the versions held)."""
    config = tmp_path / "config"
    MESH.write(config)
    server = Meshpilot(
        tmp_path,
        config,
        # The stream rate is the pool's to share; high enough that the fleet connects in seconds.
        extra=["--push-workers", str(WORKERS), "--max-requests-per-second", "400", "--log-level", "info"],
    )
    fleet = Worker(
        f"127.0.0.1:{server.grpc_port}",
        [],
        MESH.route_names(),
        per_channel=1,
        own_connections=True,
        protocol=protocol,
    )
    kind = WatchedDeltaProxy if protocol == "delta" else WatchedProxy
    proxies: list[Watched] = [kind(spec, MESH.route_names()) for spec in client_specs(STREAMS)]
    fleet.proxies = list(proxies)
    poller: asyncio.subprocess.Process | None = None
    # The simulator stands for sidecars on other machines: it yields the shared cores to the server
    # (this thread's priority; the server's processes keep theirs).
    niceness = os.getpriority(os.PRIO_PROCESS, 0)
    os.setpriority(os.PRIO_PROCESS, 0, niceness + 10)
    try:
        server.start()
        server.wait_ready(60)
        pids = worker_pids(server)
        assert sorted(pids) == list(range(WORKERS)), server.log()[-3000:]

        await fleet.start()
        await until(
            lambda: all(p.synced for p in proxies),
            180,
            lambda: f"{sum(p.synced for p in proxies)} of {STREAMS} synced",
        )

        # The kernel spreads the streams: each worker within 10% of an even share.
        split = streams_by_process(pids, server.grpc_port)
        assert sum(split.values()) == STREAMS, split
        even = STREAMS / WORKERS
        assert all(abs(n - even) <= SPLIT_TOLERANCE * even for n in split.values()), split

        # Changes of each kind, one at a time: every proxy converges on each, at one version.
        await converge(proxies, RDS, change_route(config, "change1"))
        write_yaml(config / "svc-0.yaml", MESH.service_objects(0, extra_endpoints=1))
        new_endpoint = MESH.endpoint_ip(0, MESH.endpoints_of(0)).encode()
        await converge(proxies, EDS, new_endpoint)
        grown = Scenario(**{**MESH.__dict__, "services": MESH.services + 1})
        write_yaml(config / f"svc-{MESH.services}.yaml", grown.service_objects(MESH.services))
        await converge(proxies, CDS, grown.hostname(MESH.services).encode())
        await converge(proxies, RDS, change_route(config, "change2"))
        check_responses(proxies)

        # A push storm, and one worker killed in the middle of it.
        poller = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            READY_POLLER,
            str(server.http_port),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        victim = max(split, key=lambda index: split[index])
        victim_streams = streams_by_process(pids, server.grpc_port)[victim]
        connects = {id(p): p.connects for p in proxies}
        killed_at = 0.0
        marker = b""
        started = time.monotonic()
        n = 0
        while (elapsed := time.monotonic() - started) < STORM_SECONDS:
            n += 1
            marker = change_route(config, f"storm{n}")
            if not killed_at and elapsed >= KILL_AFTER:
                os.kill(pids[victim], signal.SIGKILL)
                killed_at = time.time()
            await asyncio.sleep(STORM_INTERVAL)

        await converge(proxies, RDS, marker, timeout=180)
        moved = [p for p in proxies if p.connects > connects[id(p)]]
        # Exactly the killed worker's streams reconnected, and each is synced on its new stream.
        assert len(moved) == victim_streams, (
            f"{len(moved)} reconnected; the killed worker held {victim_streams}"
        )
        assert all(p.synced and p.connected_at >= killed_at for p in moved)
        check_responses(proxies)

        # /ready answered throughout, each time within the limit.
        out, _ = await asyncio.wait_for(poller.communicate(b""), 30)
        poller = None
        samples: list[list[Any]] = json.loads(out)
        during = [s for s in samples if s[0] >= killed_at]
        assert len(during) >= 20, f"only {len(during)} /ready probes after the kill"
        failed = [s for s in samples if s[2] != 200]
        assert not failed, f"/ready failed: {failed[:5]}"
        took = sorted(s[1] for s in samples)
        slow = [(round(at - killed_at, 2), round(t, 3)) for at, t, _ in samples if t >= READY_LIMIT]
        summary = (
            f"/ready over {protocol}: {len(samples)} probes, p95 {took[int(0.95 * len(took))]:.3f} s, "
            f"max {took[-1]:.3f} s; over {READY_LIMIT} s (s after the kill, s): {slow[:5]}"
        )
        print(summary)  # for the figures in bench/notes.md (pytest -s)
        assert took[int(0.95 * len(took))] < READY_LIMIT, summary
        assert took[-1] < READY_STALL, summary

        # The killed worker was started again, serves, and the main process counted it.
        restarted = worker_pids(server)
        assert restarted[victim] != pids[victim]
        assert len([i for i in SERVING.findall(server.log()) if int(i) == victim]) == 2, server.log()[-3000:]
        assert server.metric("meshpilot_push_worker_restarts") == 1
    finally:
        if poller is not None:
            poller.kill()
            await poller.wait()
        await fleet.stop()
        server.stop()
        with contextlib.suppress(PermissionError):  # lowering it again takes privileges
            os.setpriority(os.PRIO_PROCESS, 0, niceness)
