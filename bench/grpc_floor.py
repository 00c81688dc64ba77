"""The floor under any Python xDS push: bare grpc.aio, no meshpilot (``python -m bench.grpc_floor``).

A server process holds N bidirectional streams, each on its own connection
from client processes like the fleet simulator's. A round writes one
pre-serialized message to every stream at once and ends when every client
has read it and answered with an ACK-sized message. Nothing is generated,
looked up or recorded, so the round's wall time and CPU are what gRPC and
asyncio alone cost on this machine: a push to N proxies by meshpilot can be
no cheaper, and its fan-out figures are read against this one.

``--slots N`` hands the message out as meshpilot's push throttle does: to one
stream per free slot of N, the slot given back once the write completed. The
writes then go out one at a time instead of in one burst, which is how the
cost of that shape alone (gRPC's poller woken per write) was measured
(bench/notes.md).

``--work N`` runs some Python before each write, as a server that generates
per proxy does: it reads N objects of a pool far larger than the CPU's caches,
each write's from another part of it (``--work-pool M``: of a pool of M objects,
which the caches can hold when M is small; ``--work-batch K``: the work of K
streams done first, then the message handed to those K, as a server that
generates for a batch of proxies before it writes to them; with ``--slots``, a
batch first takes a slot for each of its streams, so K may not exceed the slots).
The round then also reports the CPU that work took inside the round (timed
around each call) and the same work timed alone in a loop before the first
round, so that what the work and gRPC cost each other, beyond their own costs,
can be read off (bench/notes.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from bench.server import free_port, process_cpu_seconds
from bench.sidecar import ENVOY_STREAM_WINDOW, retrieve_outcome
from meshpilot.server import allocator, malloc_tuning

_METHOD = "/bench.Floor/Stream"
#: What a stream is handed: write the message, then give back a slot of the round's throttle; or
#: (None) end.
_Inbox = asyncio.Queue[asyncio.Semaphore | None]


def _identity(payload: bytes) -> bytes:
    return payload


#: Objects in the work's pool (``--work``) unless told: about 100 MB, far more than any cache of the CPU.
POOL_SIZE = 1_000_000


class _Work:
    """``--work``: before each write, ``per_write`` objects of the pool read, the next write's after
    them (wrapping), so that each write's work finds its objects out of the caches."""

    def __init__(self, per_write: int, pool: int = POOL_SIZE, batch: int = 0) -> None:
        self.per_write = per_write
        #: Streams whose work is done together before their writes (0: each stream's before its own).
        self.batch = batch
        self.pool: Sequence[tuple[int, str]] = [(i, str(i)) for i in range(pool)] if per_write else ()
        self.cursor = 0
        #: CPU seconds the calls took in the current round, timed around each.
        self.seconds = 0.0

    def run(self) -> int:
        start, count = self.cursor, self.per_write
        pool = self.pool
        self.cursor = (start + count) % len(pool)
        total = 0
        for i in range(start, start + count):
            number, text = pool[i % len(pool)]
            total += number + len(text)
        return total

    def timed(self) -> None:
        if self.per_write:
            started = time.thread_time()
            self.run()
            self.seconds += time.thread_time() - started

    def alone(self, writes: int) -> float:
        """CPU seconds of ``writes`` calls in a loop, nothing between them."""
        started = time.thread_time()
        for _ in range(writes):
            self.run()
        return time.thread_time() - started


def _raise_file_limit() -> None:
    # Every stream is a connection and a descriptor on both sides.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# -- server ----------------------------------------------------------------------------


async def _serve(port: int, size: int, slots: int, work: _Work) -> None:
    payload = b"\x0a" + b"x" * (size - 1)
    queues: list[_Inbox] = []
    #: Streams that ended: with slots, handing one the message would take a slot for the round.
    ended: set[_Inbox] = set()
    state = {"acks": 0, "want": -1}
    round_done = asyncio.Event()

    async def stream(requests: Any, context: grpc.aio.ServicerContext) -> None:
        queue: _Inbox = asyncio.Queue()
        queues.append(queue)

        async def read() -> None:
            async for _ in requests:
                state["acks"] += 1
                if state["acks"] == state["want"]:
                    round_done.set()

        reader = asyncio.create_task(read())
        try:
            while (slots_of_round := await queue.get()) is not None:
                try:
                    if not work.batch:
                        work.timed()
                    await context.write(payload)
                finally:
                    slots_of_round.release()
        finally:
            ended.add(queue)
            reader.cancel()

    handler = grpc.stream_stream_rpc_method_handler(
        stream, request_deserializer=_identity, response_serializer=_identity
    )
    server = grpc.aio.server()
    generic = grpc.method_handlers_generic_handler("bench.Floor", {"Stream": handler})
    server.add_generic_rpc_handlers((generic,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    loop = asyncio.get_running_loop()
    print("listening", flush=True)
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        command = line.split()
        if command[0] == "count":
            # Each client says hello once: the count is the streams that are up.
            print(state["acks"], flush=True)
        elif command[0] == "allocator":
            # What this process runs on, as the report names it (not what it was started to run on).
            print("jemalloc" if allocator.jemalloc_mapped() else "system", flush=True)
        elif command[0] == "alone":
            # The work of a round with nothing between its calls, before the first round.
            print(work.alone(len(queues)) if work.per_write else 0.0, flush=True)
        elif command[0] == "round":
            state["acks"], state["want"] = 0, len(queues)
            work.seconds = 0.0
            round_done.clear()
            started = time.perf_counter()
            # A round's own slots: one a lost stream never gave back does not shrink the next round's.
            free = asyncio.Semaphore(slots)
            hand_out: asyncio.Task[None] | None = None
            if work.per_write and work.batch:
                throttle = free if slots else None
                hand_out = asyncio.create_task(_hand_out_batches(list(queues), free, throttle, ended, work))
            elif slots:
                # The streams of the round's start, as ``want`` counts them.
                hand_out = asyncio.create_task(_hand_out(list(queues), free, ended))
            else:
                for queue in queues:
                    queue.put_nowait(free)  # its releases only raise a count nobody waits on
            with contextlib.suppress(TimeoutError):  # a lost stream: the round reports fewer ACKs
                await asyncio.wait_for(round_done.wait(), 60)
            if hand_out is not None:
                hand_out.cancel()
            wall = time.perf_counter() - started
            print(f"{wall} {state['acks']} {len(queues)} {work.seconds}", flush=True)
    for queue in queues:
        queue.put_nowait(None)
    await server.stop(1)


async def _hand_out(queues: list[_Inbox], free: asyncio.Semaphore, ended: set[_Inbox]) -> None:
    """The message to each stream in turn, as a slot of ``free`` is given back (not to streams that
    ended)."""
    for queue in queues:
        if queue in ended:
            continue
        await free.acquire()
        queue.put_nowait(free)


async def _hand_out_batches(
    queues: list[_Inbox],
    free: asyncio.Semaphore,
    throttle: asyncio.Semaphore | None,
    ended: set[_Inbox],
    work: _Work,
) -> None:
    """``work.batch`` streams at a time: a slot of ``throttle`` for each (None: not throttled), the
    work of each, then the message to each, then a turn of the loop for their writes to start.
    ``free`` is what each stream gives back after its write (``throttle`` itself when throttled)."""
    live = [queue for queue in queues if queue not in ended]
    for first in range(0, len(live), work.batch):
        batch = live[first : first + work.batch]
        if throttle is not None:
            for _ in batch:
                await throttle.acquire()
        for _ in batch:
            work.timed()
        for queue in batch:
            queue.put_nowait(free)
        await asyncio.sleep(0)


def _server_main(
    port: int, size: int, slots: int = 0, work: int = 0, pool: int = POOL_SIZE, batch: int = 0
) -> None:
    _raise_file_limit()
    # The C allocator's settings meshpilot's server makes on glibc (none under jemalloc), before gRPC
    # starts its threads: on glibc they decide what a large write costs (bench/notes.md).
    malloc_tuning.configure()
    asyncio.run(_serve(port, size, slots, _Work(work, pool, batch)))


# -- clients ---------------------------------------------------------------------------


async def _client(target: str, streams: int, ack_size: int) -> None:
    # A connection per stream and Envoy's stream window, as the fleet simulator's sidecars have.
    options = [("grpc.use_local_subchannel_pool", 1), ("grpc.http2.lookahead_bytes", ENVOY_STREAM_WINDOW)]
    ack = b"a" * ack_size

    async def one() -> None:
        # As the fleet simulator's streams: ACKs written from the read loop. Opened again if it
        # fails: a burst of connections can overflow the listen queue.
        while True:
            channel = grpc.aio.insecure_channel(target, options=options)
            call = channel.stream_stream(
                _METHOD, request_serializer=_identity, response_deserializer=_identity
            )()
            opening = asyncio.create_task(call.write(b"hello"))
            opening.add_done_callback(retrieve_outcome)
            try:
                while (message := await call.read()) is not grpc.aio.EOF:
                    del message
                    await call.write(ack)
                return
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                opening.cancel()
                await channel.close()
                await asyncio.sleep(0.5)

    await asyncio.gather(*(one() for _ in range(streams)), return_exceptions=True)


def _client_main(target: str, streams: int, ack_size: int) -> None:
    _raise_file_limit()
    asyncio.run(_client(target, streams, ack_size))


# -- the run ---------------------------------------------------------------------------


class Floor:
    """The floor's server and clients, up, connected and warmed up by one round (``with Floor(...)
    as floor``), measured a round at a time: a suite measures a round of the floor right after each
    round of the fleet it stands beside, so that the two meet the host in the same minute
    (``bench.run``)."""

    def __init__(
        self,
        streams: int,
        size: int,
        ack_size: int,
        workers: int = 2,
        slots: int = 0,
        work: int = 0,
        pool: int = POOL_SIZE,
        batch: int = 0,
    ) -> None:
        if slots and work and batch > slots:
            # A batch takes all its slots before any of its streams writes: more than there are
            # waits for ever.
            raise ValueError(f"a batch of {batch} streams needs at least {batch} slots, not {slots}")
        self._args = (streams, size, ack_size, workers, slots, work, pool, batch)
        self._server: subprocess.Popen[str] | None = None
        self._clients: list[Any] = []
        #: What was measured of the setup: streams up, sizes, allocator (the rounds go apart).
        self.described: dict[str, Any] = {}

    def __enter__(self) -> Floor:
        return self.start()

    def start(self) -> Floor:
        """Bring the server and clients up; if that fails, nothing is left running."""
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ask(self, command: str) -> str:
        server = self._server
        assert server is not None and server.stdin is not None and server.stdout is not None
        server.stdin.write(command + "\n")
        server.stdin.flush()
        return server.stdout.readline().strip()

    def _start(self) -> None:
        streams, size, ack_size, workers, slots, work, pool, batch = self._args
        port = free_port()
        # The allocator a meshpilot server started here gets (jemalloc preloaded when installed), so
        # that the two are compared on the same one.
        memory = allocator.for_new_process()
        server = self._server = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from bench.grpc_floor import _server_main; "
                f"_server_main({port}, {size}, {slots}, {work}, {pool}, {batch})",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parent.parent,
            env={**os.environ, **memory.environment},
        )
        assert server.stdout is not None
        server.stdout.readline()  # listening
        ctx = multiprocessing.get_context("spawn")
        share = [streams // workers + (i < streams % workers) for i in range(workers)]
        for count in share:
            process = ctx.Process(
                target=_client_main, args=(f"127.0.0.1:{port}", count, ack_size), daemon=True
            )
            process.start()
            self._clients.append(process)
        # Connections come up as fast as the clients open them; wait until the count settles.
        up, deadline = -1, time.time() + 120
        while time.time() < deadline:
            time.sleep(2)
            now = int(self._ask("count"))
            if now == up:
                break
            up = now
        self.described = {
            "streams": up,
            "message_bytes": size,
            "ack_bytes": ack_size,
            "slots": slots,
            "work_per_write": work,
            "work_pool": pool if work else 0,
            "work_batch": batch if work else 0,
            "allocator": self._ask("allocator"),
        }
        if work:
            self.described["work_alone_cpu_seconds"] = round(float(self._ask("alone")), 4)
        # The first round after the streams connect cost up to twice the others (state-of-the-world's
        # large ACKs most): kept apart, not counted among the rounds.
        self.described["warm_up"] = self.round()

    def round(self) -> dict[str, Any]:
        """One message to every stream, after a second's quiet: wall time, and each side's CPU."""
        server = self._server
        assert server is not None
        time.sleep(1)
        server_cpu = process_cpu_seconds(server.pid)
        client_cpu = self._client_cpu()
        wall, acks, total, work_seconds = self._ask("round").split()
        return {
            "wall_seconds": round(float(wall), 4),
            "acks": int(acks),
            "streams": int(total),
            "server_cpu_seconds": round(process_cpu_seconds(server.pid) - server_cpu, 3),
            "client_cpu_seconds": round(self._client_cpu() - client_cpu, 3),
            **({"work_cpu_seconds": round(float(work_seconds), 4)} if self._args[5] else {}),
        }

    def _client_cpu(self) -> float:
        return sum(process_cpu_seconds(p.pid or 0) for p in self._clients)

    def close(self) -> None:
        for process in self._clients:
            process.kill()
            process.join(10)
        self._clients = []
        server, self._server = self._server, None
        if server is None:
            return
        if server.stdin is not None:
            server.stdin.close()
        if server.stdout is not None:
            server.stdout.close()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)


def run(
    streams: int,
    size: int,
    ack_size: int,
    rounds: int,
    workers: int = 2,
    slots: int = 0,
    work: int = 0,
    pool: int = POOL_SIZE,
    batch: int = 0,
) -> dict[str, Any]:
    """Rounds of one message to every stream; wall time and server/client CPU of each."""
    with Floor(streams, size, ack_size, workers, slots, work, pool, batch) as floor:
        return {**floor.described, "rounds": [floor.round() for _ in range(rounds)]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.grpc_floor", description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--size", type=int, default=600, help="bytes per pushed message")
    parser.add_argument("--ack-size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--slots", type=int, default=0, help="hand the message out N streams at a time (0: all at once)"
    )
    parser.add_argument(
        "--work", type=int, default=0, help="read N objects of a large pool before each write (0: none)"
    )
    parser.add_argument("--work-pool", type=int, default=POOL_SIZE, help="objects in the work's pool")
    parser.add_argument(
        "--work-batch", type=int, default=0, help="do K streams' work, then write to them (0: one at a time)"
    )
    args = parser.parse_args(argv)
    if args.slots < 0:
        parser.error("--slots: at least 0")
    if args.work < 0:
        parser.error("--work: at least 0")
    if args.work_pool < 1:
        parser.error("--work-pool: at least 1")
    if args.work_batch < 0:
        parser.error("--work-batch: at least 0")
    if args.slots and args.work and args.work_batch > args.slots:
        parser.error("--work-batch: at most --slots (a batch takes a slot for each of its streams)")
    result = run(
        args.streams,
        args.size,
        args.ack_size,
        args.rounds,
        slots=args.slots,
        work=args.work,
        pool=args.work_pool,
        batch=args.work_batch,
    )
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
