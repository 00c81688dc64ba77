"""Every golden case, served by a single process and by a pool of three push workers: the same bytes
from every worker (issue 20, "Shown: byte identity").

Two ``meshpilot discovery`` processes, ``--push-workers 1`` and ``--push-workers 3``, serve the
same config directory. Each case proxy asks both for its config over real ADS streams, state of the
world and delta, each stream on a connection of its own (``support.pool_fetch``); the pool's proxy
reconnects until every worker has served it, each worker known from the kernel (the process holding
the server end of the connection). Every resource must be byte for byte what the single process
serves (delta: with the same resource version), every worker must report the same push version, and
what the single process serves must be the case's golden file, so that what is compared is the
case's config and not some empty or partial state.

The mesh config is a flag, read once, so cases are grouped by their ``mesh.yaml``: each group has
one pair of servers, and its cases follow one another in the same config directory. The first case
of a group reaches the workers as the change log's snapshot and start, the others as live changes
and pushes (the old case's objects removed, the new one's added), which is the path most of a
worker's life takes.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.golden import agent_metadata
from support.pool_fetch import Served, fetch
from support.pool_sockets import ServerSockets
from support.processes import Meshpilot

from meshpilot.xds.types import TypeUrl

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CASES = Path(__file__).parents[1] / "golden" / "cases"
WORKERS = 3
#: Streams a proxy opens to the pool at least (half of each protocol), and at most while some worker
#: has not served it yet. The kernel picks a worker by a hash of the connection's ports: missing one
#: of three workers 40 times in a row happens once in 10^7.
MIN_STREAMS = 4
MAX_STREAMS = 40
SETTLE = 20.0


@dataclass(frozen=True)
class CaseProxy:
    case: str
    name: str
    node_id: str
    metadata: dict[str, Any]
    listeners: list[str] | None
    golden: dict[str, Any]


def _proxies(case: Path) -> list[CaseProxy]:
    out = []
    for name, spec in yaml.safe_load((case / "proxies.yaml").read_text()).items():
        out.append(
            CaseProxy(
                case.name,
                name,
                spec["id"],
                agent_metadata(spec["id"], spec.get("metadata") or {}),
                spec.get("listeners"),
                json.loads((case / f"{name}.golden.json").read_text()),
            )
        )
    return out


def _groups() -> list[Any]:
    """The cases by mesh config (None: istiod's defaults), one test each."""
    by_mesh: dict[str | None, list[Path]] = defaultdict(list)
    for case in sorted(p for p in CASES.iterdir() if p.is_dir()):
        mesh = case / "mesh.yaml"
        by_mesh[mesh.read_text() if mesh.exists() else None].append(case)
    params = []
    for cases in by_mesh.values():
        name = cases[0].name if len(cases) == 1 else f"default-mesh({len(cases)} cases)"
        params.append(pytest.param(cases, id=name))
    return params


def _use_case(config_dir: Path, case: Path) -> None:
    """The config directory holds ``case``'s objects, replaced in one rename (never half a file)."""
    tmp = config_dir / ".config.yaml.tmp"
    tmp.write_text((case / "config.yaml").read_text())
    tmp.replace(config_dir / "config.yaml")


class Server:
    def __init__(self, process: Meshpilot) -> None:
        self.process = process

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.process.grpc_port}"

    async def fetch(self, proxy: CaseProxy, *, delta: bool) -> Served:
        assert self.process.proc is not None
        return await fetch(
            self.target,
            proxy.node_id,
            proxy.metadata,
            delta=delta,
            listeners=proxy.listeners,
            server=(self.process.proc.pid, self.process.grpc_port),
        )

    def workers(self) -> frozenset[int]:
        assert self.process.proc is not None
        return ServerSockets.read(self.process.proc.pid, self.process.grpc_port).listening


async def _until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + SETTLE
    while not await check():
        assert time.monotonic() < deadline, f"timed out after {SETTLE}s waiting for {what}"
        await asyncio.sleep(0.1)


def _differences(reference: Served, got: Served) -> list[str]:
    out = []
    for type_url in TypeUrl.CLUSTER, TypeUrl.LISTENER, TypeUrl.ROUTE, TypeUrl.ENDPOINT:
        want, have = reference.resources.get(type_url, {}), got.resources.get(type_url, {})
        for name in sorted(want.keys() | have.keys()):
            if want.get(name) != have.get(name):
                how = "missing" if name not in have else "extra" if name not in want else "other bytes"
                out.append(f"{type_url.short} {name}: {how}")
        want_versions = reference.resource_versions.get(type_url, {})
        have_versions = got.resource_versions.get(type_url, {})
        if want_versions != have_versions:
            out.append(f"{type_url.short}: other resource versions")
    return out


def _push_version(served: Served) -> set[str]:
    """The main process's push version each response carried (a worker's own pushes append +N)."""
    return {v.partition("+")[0] for versions in served.versions.values() for v in versions}


async def _check_case(single: Server, pool: Server, proxies: list[CaseProxy], workers: frozenset[int]) -> int:
    """Compare every proxy's config between the servers; the streams opened to the pool."""
    streams = 0
    versions: set[str] = set()
    for proxy in proxies:
        label = f"{proxy.case}/{proxy.name}"

        async def matches_golden(server: Server, proxy: CaseProxy = proxy) -> bool:
            return (await server.fetch(proxy, delta=False)).as_json() == proxy.golden

        # The group's previous case may still be leaving either server (file watch, debounce).
        await _until(lambda: matches_golden(single), f"the single process to serve {label}'s golden")
        await _until(lambda: matches_golden(pool), f"the pool to serve {label}'s golden")
        reference = {delta: await single.fetch(proxy, delta=delta) for delta in (False, True)}
        for delta, served in reference.items():
            assert served.as_json() == proxy.golden, f"{label} (delta={delta}): single process != golden"
        served_by: set[int] = set()
        count = 0
        while count < MIN_STREAMS or served_by != workers:
            assert count < MAX_STREAMS, (
                f"{label}: {count} streams reached only {len(served_by)} of {len(workers)} workers"
            )
            delta = count % 2 == 1
            got = await pool.fetch(proxy, delta=delta)
            count += 1
            assert got.process in workers, f"{label}: served by {got.process}, not a worker of {workers}"
            served_by.add(got.process)
            differ = _differences(reference[delta], got)
            assert not differ, (
                f"{label} (delta={delta}): worker {got.process} serves other bytes than a single "
                f"process: {differ}"
            )
            versions |= _push_version(got)
        streams += count
    assert len(versions) == 1, f"{proxies[0].case}: the workers served different push versions {versions}"
    return streams


@pytest.mark.parametrize("cases", _groups())
async def test_every_worker_serves_the_bytes_of_a_single_process(tmp_path: Path, cases: list[Path]) -> None:
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    _use_case(config_dir, cases[0])
    mesh = cases[0] / "mesh.yaml"
    processes = [
        Meshpilot(
            tmp_path / f"workers-{n}",
            config_dir,
            mesh_config=mesh if mesh.exists() else None,
            extra=["--push-workers", str(n)],
        )
        for n in (1, WORKERS)
    ]
    try:
        for process in processes:
            process.start()
        for process in processes:
            process.wait_ready(60)
        single, pool = (Server(p) for p in processes)
        workers = pool.workers()
        assert len(workers) == WORKERS, f"expected {WORKERS} processes on the xDS port, found {workers}"
        assert processes[1].proc is not None and processes[1].proc.pid not in workers
        streams = 0
        for i, case in enumerate(cases):
            if i:
                _use_case(config_dir, case)
            streams += await _check_case(single, pool, _proxies(case), workers)
        # A worker that died and came back would serve, but not under the pid it started with.
        assert pool.workers() == workers, "a worker was replaced during the test"
        print(f"{len(cases)} cases, {streams} streams over {WORKERS} workers: identical bytes")
    finally:
        for process in processes:
            process.stop()
