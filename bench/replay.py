"""A push's server-side cost in one process, without gRPC: ``python -m bench.replay``.

meshpilot's own discovery server (``DiscoveryApp``'s) serves a scenario's proxies over delta, each
stream an object in the same event loop standing for the proxy: it subscribes as the fleet
simulator does (``fleet_delta``: clusters, their endpoints, listeners, their routes) and ACKs every
response. Then an endpoint is added to a service and that service's VirtualService is rewritten, in
turn, ``--rounds`` times; a change ends when the server has read every proxy's ACK of the type it
changes. Reported per change: the process's CPU seconds and wall time for each round, and of that CPU
what the proxies took (handling responses, building ACKs; timed in their handlers).

What it is for: a busy host moves the fleet's figures by more than most changes to the push path
(``bench/notes.md``); this leaves out the kernel, gRPC and the simulator's processes. Its CPU seconds
still move with the host (by a fifth between rounds on a busy one), so for comparing two trees it
also counts instructions, which do not: run under valgrind,

    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=OUT \
        python -m bench.replay --scale 0.1 --callgrind OUT

and each measured round's instructions (server and proxies, everything in the process) are read from
a callgrind dump (about fifty times slower: scale it down). ``PYTHONPATH`` naming another tree's
``src`` runs that tree's server; ``--profile`` writes a cProfile of the measured rounds. It is not a
goal measure: the goals are the fleet's, with real streams. Delta only; the first round of each
change is left out of the medians (it builds what later rounds find cached).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import grpc

from bench.fleet_delta import DeltaProxy, apply_response, delta_request, follow_up, opening_requests
from bench.measure import fleet_specs
from bench.scenario import Scenario
from bench.sidecar import EDS, RDS
from bench.wirescan import scan_delta_response
from meshpilot.config.decode import decode_object
from meshpilot.server import gc_tuning
from meshpilot.server.app import DiscoveryApp
from meshpilot.server.object_router import ObjectRouter
from meshpilot.server.settings import DiscoverySettings
from meshpilot.xds.delta_stream import DeltaStream

ROOT = Path(__file__).resolve().parent.parent
#: What each change makes every proxy receive.
CHANGES = {"endpoint_added": EDS, "virtual_service_changed": RDS}


@dataclass
class _Round:
    """The type a change sends, and the proxies whose ACK of it the server has read."""

    type_url: str
    proxies: int
    done: asyncio.Future[None]
    acked: set[int] = field(default_factory=set)

    def ack_read(self, client: _Client, type_url: str) -> None:
        if type_url == self.type_url:
            self.acked.add(id(client))
            if len(self.acked) == self.proxies and not self.done.done():
                self.done.set_result(None)


@dataclass
class _Client:
    """One proxy's end of a stream, as the grpc.aio context the server writes to and the requests it
    reads. Subscribes as Envoy does until synced, then only ACKs (cheaper, so that the server's share
    stands out)."""

    proxy: DeltaProxy
    #: Requests, each with the type it ACKs ("" for none); None ends the stream.
    requests: asyncio.Queue[tuple[bytes, str] | None] = field(default_factory=asyncio.Queue)
    synced: bool = False
    round: _Round | None = None
    #: CPU seconds spent in this proxy's handling of responses.
    seconds: float = 0.0

    async def read(self) -> AsyncIterator[bytes]:
        while (item := await self.requests.get()) is not None:
            request, acks = item
            yield request
            # The server asks for the next request once it has handled this one.
            if acks and self.round is not None:
                self.round.ack_read(self, acks)

    def send(self, request: bytes, acks: str = "") -> None:
        self.requests.put_nowait((request, acks))

    # -- what the server calls (grpc.aio.ServicerContext) -----------------------------

    def peer(self) -> str:
        return "ipv4:127.0.0.1:15000"

    def invocation_metadata(self) -> tuple[()]:
        return ()

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise RuntimeError(f"the server ended a stream: {code.name}: {details}")

    async def write(self, payload: bytes) -> None:
        # Everything runs on the event loop's thread: its CPU time is this handler's.
        started = time.thread_time()
        if self.synced:
            type_url, nonce, _, _ = scan_delta_response(payload)
            self.send(delta_request(type_url, nonce=nonce), type_url)
        else:
            type_url, nonce = apply_response(self.proxy, payload)
            self.send(delta_request(type_url, nonce=nonce), type_url)
            self.proxy.acked.add(type_url)
            for request in follow_up(self.proxy, type_url):
                self.send(request)
        self.seconds += time.thread_time() - started


@dataclass(frozen=True, slots=True)
class RoundResult:
    cpu_seconds: float
    wall_seconds: float
    proxies_cpu_seconds: float
    #: Under callgrind (``Callgrind``): the instructions the process ran in the round.
    instructions: int | None = None


class Callgrind:
    """This process's instruction counts from valgrind's callgrind, which it runs under with
    ``--instr-atstart=no --callgrind-out-file=<out>``: instrumented from ``start``, zeroed before a
    round and dumped after it (dumps are numbered ``<out>.1``, ``<out>.2``, ...)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.dumps = 0

    def _control(self, option: str) -> None:
        subprocess.run(
            ["callgrind_control", option, str(os.getpid())], check=True, capture_output=True, timeout=60
        )

    def start(self) -> None:
        self._control("--instr=on")

    def zero(self) -> None:
        self._control("--zero")

    def count(self) -> int:
        self._control("--dump")
        self.dumps += 1
        dump = Path(f"{self.out}.{self.dumps}")
        for line in dump.read_text().splitlines():
            if line.startswith("totals:"):
                return int(line.split()[1])
        raise ValueError(f"{dump}: no totals line")


async def replay(
    scenario: Scenario,
    rounds: int,
    *,
    timeout: float = 120.0,
    profile: cProfile.Profile | None = None,
    callgrind: Callgrind | None = None,
    after_load: Callable[[], None] | None = None,
    changes: tuple[str, ...] = tuple(CHANGES),
) -> dict[str, list[RoundResult]]:
    """Serve ``scenario``'s proxies in this event loop and make each of ``changes`` (names of
    ``CHANGES``) ``rounds`` times; ``after_load`` runs once the scenario is loaded, before the first
    snapshot."""
    app = DiscoveryApp(
        DiscoverySettings(max_requests_per_second=1e9, secure_grpc_addr=None, webhook_addr=None)
    )
    router = ObjectRouter(app.store, app.kube, app.credentials)
    with router.batch():
        for docs in scenario.objects().values():
            for doc in docs:
                router.upsert(decode_object(doc).obj)
    if after_load is not None:
        after_load()
    server = app.server
    server.start_serving()
    tasks = [asyncio.create_task(server.run())]
    clients = [_Client(DeltaProxy(spec, scenario.route_names())) for spec in fleet_specs(scenario)]
    try:
        for client in clients:
            for request in opening_requests(client.proxy, client.proxy.spec.node().SerializeToString()):
                client.send(request)
            context = cast(grpc.aio.ServicerContext, client)
            tasks.append(asyncio.create_task(server.serve_stream(DeltaStream, client.read(), context)))
        await _until(lambda: all(c.proxy.synced for c in clients), timeout, "the proxies to sync")
        for client in clients:
            client.synced = True
        results: dict[str, list[RoundResult]] = {change: [] for change in changes}
        if callgrind is not None:
            callgrind.start()
        for number in range(rounds):
            for change in changes:
                type_url = CHANGES[change]
                await asyncio.sleep(0.3)  # past the debounce of anything before
                if profile is not None and number > 0:
                    profile.enable()
                outcome = await _round(
                    app, router, scenario, clients, change, type_url, number, timeout, callgrind
                )
                if profile is not None:
                    profile.disable()
                results[change].append(outcome)
        return results
    finally:
        for client in clients:
            client.requests.put_nowait(None)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _round(
    app: DiscoveryApp,
    router: ObjectRouter,
    scenario: Scenario,
    clients: list[_Client],
    change: str,
    type_url: str,
    number: int,
    timeout: float,
    callgrind: Callgrind | None,
) -> RoundResult:
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    current = _Round(type_url, len(clients), done)
    for client in clients:
        client.round = current
        client.seconds = 0.0
    if callgrind is not None:
        callgrind.zero()
    cpu, wall = time.process_time(), time.perf_counter()
    if change == "endpoint_added":
        # The new endpoint's Pod, then the EndpointSlice naming it (as the API server sends them).
        docs = scenario.service_objects(0, extra_endpoints=number + 1)
        changed = [d for d in docs if d["kind"] == "Pod"][-1:] + [
            d for d in docs if d["kind"] == "EndpointSlice"
        ]
    else:
        changed = [scenario.virtual_service(0, marker=f"round-{number}")]
    for doc in changed:
        router.upsert(decode_object(doc).obj)
    await asyncio.wait_for(done, timeout)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    instructions = callgrind.count() if callgrind is not None else None
    result = RoundResult(cpu, wall, sum(c.seconds for c in clients), instructions)
    for client in clients:
        client.round = None
    return result


async def _until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what} after {timeout:.0f} s")
        await asyncio.sleep(0.05)


def summary(results: dict[str, list[RoundResult]]) -> dict[str, Any]:
    """Each change's rounds, and the medians of those after the first."""
    out: dict[str, Any] = {}
    for change, rounds in results.items():
        later = rounds[1:] or rounds
        out[change] = {
            "rounds": [
                {
                    "cpu_seconds": round(r.cpu_seconds, 4),
                    "wall_seconds": round(r.wall_seconds, 4),
                    "proxies_cpu_seconds": round(r.proxies_cpu_seconds, 4),
                    "instructions": r.instructions,
                }
                for r in rounds
            ],
            "median_cpu_seconds": round(statistics.median(r.cpu_seconds for r in later), 4),
            "median_server_cpu_seconds": round(
                statistics.median(r.cpu_seconds - r.proxies_cpu_seconds for r in later), 4
            ),
        }
        counted = [r.instructions for r in later if r.instructions is not None]
        if counted:
            out[change]["median_instructions"] = int(statistics.median(counted))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", default="http", help="a file of bench/scenarios, by name")
    parser.add_argument("--scale", type=float, default=1.0, help="services and proxies scaled by this")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--change",
        choices=sorted(CHANGES),
        action="append",
        help="make only this change (repeatable; default: each in turn)",
    )
    parser.add_argument("--profile", type=Path, help="write a cProfile of the rounds after the first here")
    parser.add_argument(
        "--callgrind",
        type=Path,
        metavar="OUT",
        help="count instructions per round; run under callgrind with --callgrind-out-file=OUT",
    )
    args = parser.parse_args(argv)
    scenario = Scenario.load(ROOT / "bench" / "scenarios" / f"{args.scenario}.yaml")
    if args.scale != 1.0:
        scenario = scenario.scaled(args.scale)
    profile = cProfile.Profile() if args.profile else None
    callgrind = Callgrind(args.callgrind) if args.callgrind else None
    # The collector as the server runs it (``server.run``): without this, full collections of the
    # loaded model land in whichever push allocates at the time.
    gc_tuning.configure()
    results = asyncio.run(
        replay(
            scenario,
            args.rounds,
            profile=profile,
            callgrind=callgrind,
            after_load=gc_tuning.freeze_loaded,
            changes=tuple(dict.fromkeys(args.change or CHANGES)),  # each once, however often named
        )
    )
    if profile is not None:
        profile.dump_stats(args.profile)
    report = {
        "scenario": scenario.name,
        "proxies": scenario.proxies,
        "services": scenario.services,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "changes": summary(results),
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
