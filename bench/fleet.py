"""The fleet simulator: many sidecars over real ADS gRPC streams, spread over worker processes.

Each simulated sidecar behaves as Envoy does on a state-of-the-world stream:
CDS, then EDS for the clusters it got, then LDS, then RDS for its route
names, ACKing every response with its nonce. With ``protocol="delta"`` the
sidecars speak delta xDS instead (``bench.fleet_delta``). The runner can "arm"
a marker (bytes that a change will put into a response of some type); every
stream then records when a response containing it arrives, which is when that
proxy has converged (it ACKs at once).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.connection
import os
import random
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import grpc
from envoy.service.discovery.v3 import discovery_pb2

from bench.fleet_delta import DeltaProxy, run_delta_proxy
from bench.server import process_cpu_seconds
from bench.sidecar import (
    CDS,
    EDS,
    ENVOY_STREAM_WINDOW,
    LDS,
    PROTOCOLS,
    RDS,
    ProxySpec,
    SimProxy,
    identity,
    length_delimited,
    record_end,
    retrieve_outcome,
    send,
)
from bench.wirescan import resource_name, scan_response
from meshpilot.server import gc_tuning

ADS = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
_field = length_delimited


def _names_field(proxy: SimProxy, type_url: str, names: list[str]) -> bytes:
    """The encoded resource_names of a request, kept while the proxy asks for the same list.

    An EDS ACK repeats a thousand cluster names; building them into a message
    for every ACK made the simulator cost as much as the server it measures.
    """
    cached = proxy.names_encoded.get(type_url)
    if cached is not None and cached[0] is names:
        return cached[1]
    encoded = b"".join(_field(3, name.encode()) for name in names)
    proxy.names_encoded[type_url] = (names, encoded)
    return encoded


def ack_bytes(type_url: str, names: list[str], version: str, nonce: str) -> int:
    """The size of the ACK a simulated sidecar sends for a response of this type, names, version and nonce."""
    proxy = SimProxy(ProxySpec("", {}), [], nonces={type_url: nonce}, versions={type_url: version})
    return len(_request(proxy, type_url, names, first=False))


def _request(proxy: SimProxy, type_url: str, names: list[str], first: bool) -> bytes:
    """A serialized DiscoveryRequest, byte for byte what protobuf would write (fields in order)."""
    version = proxy.versions.get(type_url, "")
    nonce = proxy.nonces.get(type_url, "")
    if first:
        request = discovery_pb2.DiscoveryRequest(
            type_url=type_url,
            resource_names=names,
            response_nonce=nonce,
            version_info=version,
            node=proxy.spec.node(),
        )
        data: bytes = request.SerializeToString()
        return data
    return b"".join(
        (
            _field(1, version.encode()) if version else b"",
            _names_field(proxy, type_url, names),
            _field(4, type_url.encode()),
            _field(5, nonce.encode()) if nonce else b"",
        )
    )


async def run_proxy(proxy: SimProxy, channel: grpc.aio.Channel) -> None:
    """Keep one proxy's stream up, reconnecting with backoff as Envoy does."""
    backoff = 0.5
    while not proxy.stopping:
        # Requests are written from this loop, as Envoy does from its one thread: no request
        # iterator, no queue and no task between reading a response and sending its ACK.
        call = channel.stream_stream(ADS, request_serializer=identity, response_deserializer=identity)()

        proxy.connects += 1
        proxy.connected_at = time.time()
        proxy.acked.clear()
        proxy.nonces.clear()
        proxy.versions.clear()
        proxy.counts.clear()
        proxy.names.clear()
        proxy.eds_names = []
        first_cds = True
        # Not awaited here: a write before the stream is up waits for its headers to go out,
        # which never happens if the server is down; the read below sees the failure instead.
        opening = asyncio.create_task(send(proxy, call, _request(proxy, CDS, [], first=True)))
        opening.add_done_callback(retrieve_outcome)
        try:
            while True:
                data = await call.read()
                if data is grpc.aio.EOF:
                    break
                now = time.time()
                backoff = 0.5
                proxy.bytes_received += len(data)
                version, type_url, nonce, spans = scan_response(data)
                proxy.nonces[type_url] = nonce
                proxy.versions[type_url] = version
                if type_url not in proxy.counts:
                    proxy.counts[type_url] = len(spans)
                    if proxy.record_names:
                        proxy.names[type_url] = sorted(resource_name(data, s) for s in spans)
                proxy.saw(type_url, data, now)
                if type_url == CDS:
                    names = [resource_name(data, s) for s in spans]
                    eds = sorted(n for n in names if n.startswith("outbound|"))
                    if first_cds and not eds:
                        proxy.empty_configs += 1
                    await send(proxy, call, _request(proxy, CDS, [], first=False))
                    if eds != proxy.eds_names or first_cds:
                        proxy.eds_names = eds
                        await send(proxy, call, _request(proxy, EDS, eds, first=False))
                    first_cds = False
                elif type_url == EDS:
                    await send(proxy, call, _request(proxy, EDS, proxy.eds_names, first=False))
                    if LDS not in proxy.acked and LDS not in proxy.nonces:
                        await send(proxy, call, _request(proxy, LDS, [], first=False))
                elif type_url == LDS:
                    await send(proxy, call, _request(proxy, LDS, [], first=False))
                    if proxy.route_names and RDS not in proxy.nonces:
                        await send(proxy, call, _request(proxy, RDS, proxy.route_names, first=False))
                elif type_url == RDS:
                    await send(proxy, call, _request(proxy, RDS, proxy.route_names, first=False))
                proxy.acked.add(type_url)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as err:
            if not proxy.stopping:
                await record_end(proxy, call, err)
        finally:
            opening.cancel()
            call.cancel()
        if proxy.stopping:
            return
        # Envoy's xDS retry: a random wait up to a ceiling that doubles from 0.5 s to 30 s,
        # back to 0.5 s once a stream got a response.
        await asyncio.sleep(random.uniform(0, backoff))
        backoff = min(backoff * 2, 30.0)


def _sum_counts(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for count in counts:
        for key, n in count.items():
            out[key] = out.get(key, 0) + n
    return out


#: How a proxy's stream is kept up, by protocol.
Runner = Callable[[Any, grpc.aio.Channel], Coroutine[Any, Any, None]]


class Worker:
    """The proxies of one worker process, driven by commands from the runner."""

    def __init__(
        self,
        target: str,
        specs: list[ProxySpec],
        route_names: list[str],
        per_channel: int,
        own_connections: bool = False,
        protocol: str = "sotw",
    ) -> None:
        """``route_names`` are the RDS names a state-of-the-world proxy asks for; a delta proxy
        subscribes to the names its listeners hold instead, as Envoy does."""
        if protocol not in PROTOCOLS:
            raise ValueError(f"unknown xDS protocol {protocol!r}")
        self.target = target
        self.protocol = protocol
        self.proxies: list[SimProxy] = [
            DeltaProxy(spec, route_names) if protocol == "delta" else SimProxy(spec, route_names)
            for spec in specs
        ]
        self.runner: Runner = run_delta_proxy if protocol == "delta" else run_proxy
        if self.proxies:
            self.proxies[0].record_names = True
        self.per_channel = per_channel
        self.own_connections = own_connections
        self.tasks: list[asyncio.Task[None]] = []
        self.channels: list[grpc.aio.Channel] = []

    async def start(self) -> None:
        options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", 1 << 30),
            ("grpc.enable_retries", 0),
        ]
        # Envoy's default HTTP/2 stream window (256 MiB), not gRPC's 64 KiB: with the smaller one a
        # 200 KB route configuration took several WINDOW_UPDATE round trips per proxy, which cost the
        # server and the simulator a fifth of their CPU in a route push (bench/notes.md).
        options.append(("grpc.http2.lookahead_bytes", ENVOY_STREAM_WINDOW))
        if self.own_connections:
            # gRPC shares one connection among channels with equal arguments (its global
            # subchannel pool); a local pool gives each channel its own, as each Envoy has.
            options.append(("grpc.use_local_subchannel_pool", 1))
        for i, proxy in enumerate(self.proxies):
            if i % self.per_channel == 0:
                self.channels.append(grpc.aio.insecure_channel(self.target, options=options))
            proxy.stopping = False
            self.tasks.append(asyncio.create_task(self.runner(proxy, self.channels[-1])))

    async def stop(self) -> None:
        for proxy in self.proxies:
            proxy.stopping = True
        for channel in self.channels:
            await channel.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks, self.channels = [], []

    def status(self, since: float = 0.0) -> dict[str, Any]:
        return {
            "proxies": len(self.proxies),
            "synced": sum(p.synced and p.connected_at >= since for p in self.proxies),
            "connects": sum(p.connects for p in self.proxies),
            "empty_configs": sum(p.empty_configs for p in self.proxies),
            "ended": _sum_counts(p.ended for p in self.proxies),
            "samples": [e for p in self.proxies for e in p.samples][:5],
            "bytes": sum(p.bytes_received for p in self.proxies),
            "bytes_sent": sum(p.bytes_sent for p in self.proxies),
            # What the EDS ACKs repeat, which bench.run's floor sends as its ACKs.
            "eds_names_bytes": sum(len(p.names_encoded.get(EDS, ([], b""))[1]) for p in self.proxies),
            # The first proxy's resources on its stream: what a server gave one sidecar.
            "resources": [self.proxies[0].resource_counts()] if self.proxies else [],
            # Delta only: resources received and removals, by type, over every stream.
            "received": _sum_counts(getattr(p, "received", {}) for p in self.proxies),
            "removed": _sum_counts(getattr(p, "removed", {}) for p in self.proxies),
        }

    def names(self) -> dict[str, list[str]]:
        """The resource names the first proxy holds of each type (state-of-the-world: the first
        response of each type on its stream)."""
        return self.proxies[0].resource_names() if self.proxies else {}

    def arm(self, marker: bytes, type_url: str) -> None:
        for proxy in self.proxies:
            proxy.marker, proxy.marker_type, proxy.marker_seen = marker, type_url, None

    def collect(self) -> list[float | None]:
        return [p.marker_seen for p in self.proxies]


async def _serve(conn: multiprocessing.connection.Connection, worker: Worker) -> None:
    loop = asyncio.get_running_loop()
    commands: asyncio.Queue[Any] = asyncio.Queue()

    def receive() -> None:
        try:
            commands.put_nowait(conn.recv())
        except (EOFError, OSError):
            # The bench is gone (killed, or it crashed): stop, rather than read a closed pipe forever.
            loop.remove_reader(conn.fileno())
            commands.put_nowait(("gone",))

    loop.add_reader(conn.fileno(), receive)
    while True:
        command = await commands.get()
        if command[0] == "gone":
            await worker.stop()
            return
        try:
            done = await _command(conn, worker, command)
        except (BrokenPipeError, ConnectionResetError):  # gone while this command ran
            await worker.stop()
            return
        if done:
            return


async def _command(conn: multiprocessing.connection.Connection, worker: Worker, command: Any) -> bool:
    """Carry out one of the bench's commands and answer it; True after "stop"."""
    name = command[0]
    if name == "start":
        await worker.start()
        conn.send("ok")
    elif name == "status":
        conn.send(worker.status(command[1]))
    elif name == "arm":
        worker.arm(command[1], command[2])
        conn.send("ok")
    elif name == "collect":
        conn.send(worker.collect())
    elif name == "names":
        conn.send(worker.names())
    elif name == "restart":
        await worker.stop()
        await worker.start()
        conn.send("ok")
    elif name == "stop":
        await worker.stop()
        conn.send("ok")
        return True
    return False


def _worker_main(
    conn: multiprocessing.connection.Connection,
    target: str,
    specs: list[ProxySpec],
    route_names: list[str],
    per_channel: int,
    own_connections: bool,
    protocol: str,
) -> None:
    # A worker's thousands of streams live as long as the run. With CPython's default thresholds
    # the collector scanned them all, collecting nothing, in full collections of 0.1-0.6 s, also
    # while a push fanned out: ACKs, and so the convergence being measured, waited for it. The
    # server's thresholds make full collections rare here too.
    gc_tuning.configure()
    worker = Worker(target, specs, route_names, per_channel, own_connections, protocol)
    asyncio.run(_serve(conn, worker))


class Fleet:
    """The runner's handle on the worker processes."""

    def __init__(
        self,
        target: str,
        specs: list[ProxySpec],
        route_names: list[str],
        *,
        workers: int = 0,
        per_channel: int = 1,
        own_connections: bool = False,
        protocol: str = "sotw",
    ) -> None:
        """``per_channel`` streams share a gRPC channel. Channels share one HTTP/2 connection per
        worker process unless ``own_connections``: then each channel has its own, as real sidecars do
        (the server then does more work per push; see bench/notes.md). ``protocol`` is "sotw"
        (StreamAggregatedResources) or "delta" (DeltaAggregatedResources, see bench.fleet_delta)."""
        if protocol not in PROTOCOLS:
            raise ValueError(f"unknown xDS protocol {protocol!r}")
        self.protocol = protocol
        count = workers or max(1, min(os.cpu_count() or 1, len(specs) // 200 + 1))
        ctx = multiprocessing.get_context("spawn")
        self.conns: list[multiprocessing.connection.Connection] = []
        self.processes = []
        for w in range(count):
            parent, child = ctx.Pipe()
            share = specs[w::count]
            process = ctx.Process(
                target=_worker_main,
                args=(child, target, share, route_names, per_channel, own_connections, protocol),
                daemon=True,
            )
            process.start()
            self.conns.append(parent)
            self.processes.append(process)

    def _all(self, *command: Any, timeout: float = 120) -> list[Any]:
        for conn in self.conns:
            conn.send(command)
        replies = []
        for conn in self.conns:
            if not conn.poll(timeout):
                raise TimeoutError(f"fleet worker did not answer {command[0]}")
            replies.append(conn.recv())
        return replies

    def start(self) -> None:
        self._all("start")

    def cpu_seconds(self) -> float:
        """CPU seconds the worker processes have used so far."""
        return sum(process_cpu_seconds(p.pid) for p in self.processes if p.pid is not None)

    def status(self, since: float = 0.0) -> dict[str, Any]:
        """Totals over the workers; "synced" counts proxies synced on a stream opened after ``since``."""
        replies = self._all("status", since)
        out: dict[str, Any] = {"samples": []}
        for reply in replies:
            for key, value in reply.items():
                if key in ("ended", "received", "removed"):
                    out[key] = _sum_counts([out.get(key, {}), value])
                elif key == "resources":
                    out["resources"] = out.get("resources", []) + value
                else:
                    out[key] = out.get(key, 0 if key != "samples" else []) + value
        return out

    def wait_synced(self, timeout: float, since: float = 0.0) -> float:
        """Seconds until every proxy has ACKed every type on a stream opened after ``since``."""
        started = time.time()
        while time.time() - started < timeout:
            status = self.status(since)
            if status["synced"] == status["proxies"]:
                return time.time() - started
            time.sleep(0.2)
        raise TimeoutError(f"fleet not synced after {timeout}s: {self.status(since)}")

    def wait_quiet(self, quiet: float, timeout: float) -> float:
        """Seconds until no proxy has received a byte for ``quiet`` seconds (less that quiet spell)."""
        started = time.time()
        last, last_change = -1, started
        while time.time() - started < timeout:
            received = self.status()["bytes"]
            if received != last:
                last, last_change = received, time.time()
            elif time.time() - last_change >= quiet:
                return last_change - started
            time.sleep(0.2)
        raise TimeoutError(f"fleet still receiving after {timeout}s")

    def arm(self, marker: bytes, type_url: str) -> None:
        self._all("arm", marker, type_url)

    def names(self) -> dict[str, list[str]]:
        """Resource names by type of the first proxy of the first worker (see ``Worker.names``)."""
        return dict(self._all("names")[0])

    def collect(self) -> list[float | None]:
        return [t for reply in self._all("collect") for t in reply]

    def wait_marker(self, expected: int, timeout: float) -> list[float | None]:
        started = time.time()
        times = self.collect()
        while time.time() - started < timeout:
            times = self.collect()
            if sum(t is not None for t in times) >= expected:
                break
            time.sleep(0.1)
        return times

    def restart(self) -> None:
        self._all("restart", timeout=300)

    def stop(self) -> None:
        try:
            self._all("stop", timeout=60)
        finally:
            for process in self.processes:
                process.join(10)
                if process.is_alive():
                    process.kill()
