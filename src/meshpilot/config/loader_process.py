"""A child process that reads and decodes config files, so no file can stall or bloat the server.

Parsing YAML and decoding objects is CPU work in C extensions that hold the
GIL; on the server's event loop a slow or huge file stops every push and
probe until it is done, and a file that expands in memory takes the server
with it. In a child process the server only waits (on a thread of its own)
for the answer, with a deadline: a file that takes longer than
``FileLimits.seconds`` is rejected and the child killed and started again on
the next file. The child's address space is capped (``FileLimits.memory_bytes``
beyond its start), so what the other limits miss fails there. When the server
dies the child reads end-of-file on its stdin and exits.

The protocol is length-prefixed pickles on the child's stdin and stdout:
(path, limits, default namespace) in, ``list[LoadedDocument]`` out (and whether the child
exits after it). The child
is our own code run from ``sys.executable``; it is started with ``-m``, not
forked, because the server process holds gRPC's threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import resource
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

import meshpilot
from meshpilot.config.file_limits import DEFAULT_LIMITS, FileLimits
from meshpilot.config.file_loader import LoadedDocument, Rejection, load_file

log = logging.getLogger(__name__)

_HEADER = struct.Struct("<Q")
#: An answer's head: its size, and whether the child exits after it (it ran out of memory).
_ANSWER = struct.Struct("<Q?")
#: Time for a new child to start answering, on top of a file's own time.
_START_SECONDS = 30.0


class LoaderFailed(Exception):
    """The child did not answer: it timed out, died or could not be started."""


class ProcessLoader:
    """A ``FileLoader`` that loads each file in a child process, within the limits' time."""

    def __init__(self, limits: FileLimits = DEFAULT_LIMITS, default_namespace: str = "default") -> None:
        self.limits = limits
        self.default_namespace = default_namespace
        self._child: subprocess.Popen[bytes] | None = None
        self._started_at = 0.0
        #: One file at a time: the child answers requests in order.
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="config-loader")
        self._closed = False
        #: Held while a file is in the child: only its holder closes the pipes.
        self._busy = threading.Lock()

    async def load(self, path: Path) -> list[LoadedDocument]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.load_now, path)

    def load_now(self, path: Path) -> list[LoadedDocument]:
        """Load ``path`` in the child, blocking this thread; never raises for the file's sake."""
        with self._busy:
            try:
                return self._exchange(path)
            except LoaderFailed as err:
                self._stop_child()
                return [_rejected(path, str(err))]

    async def close(self) -> None:
        self._closed = True
        child = self._child
        if child is not None:
            # Ends a wait in progress: the loading thread reads end-of-file and cleans up. Its pipes
            # are not closed under it (another thread's descriptor could take their number).
            with contextlib.suppress(OSError):
                child.kill()
        if self._busy.acquire(blocking=False):
            try:
                self._stop_child()
            finally:
                self._busy.release()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def __del__(self) -> None:
        # A loader dropped without close() (a test's source) must not leave its child running.
        self._stop_child()

    @property
    def child_pid(self) -> int | None:
        return self._child.pid if self._child is not None and self._child.poll() is None else None

    # -- internals -------------------------------------------------------------

    def _exchange(self, path: Path) -> list[LoadedDocument]:
        if self._closed:
            raise LoaderFailed("the loader is closed")
        child = self._running_child()
        assert child.stdin is not None and child.stdout is not None
        request = pickle.dumps((str(path), self.limits, self.default_namespace), pickle.HIGHEST_PROTOCOL)
        try:
            child.stdin.write(_HEADER.pack(len(request)) + request)
            child.stdin.flush()
        except OSError as err:
            raise LoaderFailed(f"the loader process is gone ({err})") from None
        budget = self.limits.seconds
        if self._started_at:  # a new child: its start-up is not the file's time
            budget += _START_SECONDS
            self._started_at = 0.0
        deadline = time.monotonic() + budget
        try:
            head = _read_exactly(child.stdout, _ANSWER.size, deadline)
            size, exiting = _ANSWER.unpack(head)
            payload = _read_exactly(child.stdout, size, deadline)
        except TimeoutError:
            raise LoaderFailed(
                f"loading took longer than the limit of {self.limits.seconds:g} s; stopped"
            ) from None
        except EOFError:
            code = child.wait()
            reason = _exit_reason(code, self.limits)
            raise LoaderFailed(f"the loader process ended while reading it ({reason})") from None
        result: list[LoadedDocument] = pickle.loads(payload)
        if exiting:
            self._stop_child()
        return result

    def _running_child(self) -> subprocess.Popen[bytes]:
        if self._child is not None and self._child.poll() is None:
            return self._child
        self._stop_child()
        # The child imports meshpilot from where this process did, whatever the working directory.
        package_root = str(Path(meshpilot.__file__).resolve().parents[1])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
        try:
            self._child = subprocess.Popen(
                [sys.executable, "-m", "meshpilot.config.loader_process", str(self.limits.memory_bytes)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
            )
        except OSError as err:
            raise LoaderFailed(f"cannot start the loader process: {err}") from None
        self._started_at = time.monotonic()
        log.debug("config loader process %d started", self._child.pid)
        return self._child

    def _stop_child(self) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        with contextlib.suppress(OSError):
            child.kill()
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(5)


def _rejected(path: Path, reason: str) -> LoadedDocument:
    where = str(path)
    return LoadedDocument(where, None, rejection=Rejection(where, "file", reason))


def _exit_reason(code: int, limits: FileLimits) -> str:
    # Most likely the memory limit, met where it could not be answered (an allocation in C).
    memory = f"its memory limit is {limits.memory_bytes:,} bytes"
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        return f"signal {name}; {memory}"
    return f"exit code {code}; {memory}"


def _read_exactly(stream: IO[bytes], size: int, deadline: float) -> bytes:
    fd = stream.fileno()
    chunks: list[bytes] = []
    remaining = size
    while remaining:
        wait = deadline - time.monotonic()
        if wait <= 0:
            raise TimeoutError
        readable, _, _ = select.select([fd], [], [], wait)
        if not readable:
            raise TimeoutError
        try:
            chunk = os.read(fd, min(remaining, 1 << 20))
        except OSError:
            raise EOFError from None
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


# -- the child -------------------------------------------------------------------


def _serve(requests: IO[bytes], answers: IO[bytes]) -> None:
    while True:
        header = requests.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return  # the server is gone
        (size,) = _HEADER.unpack(header)
        path, limits, default_namespace = pickle.loads(requests.read(size))
        exhausted = False
        try:
            payload = _answer(load_file(Path(path), limits, default_namespace))
        except MemoryError:
            exhausted = True
            reason = f"loading it needed more than the loader's {limits.memory_bytes:,} bytes of memory"
            payload = _answer([_rejected(Path(path), reason)])
        except Exception as err:  # a decoder bug must reject the file, not end the loader
            payload = _answer([_rejected(Path(path), f"the loader failed: {type(err).__name__}: {err}")])
        answers.write(_ANSWER.pack(len(payload), exhausted) + payload)
        answers.flush()
        if exhausted:
            return  # a fresh process, not a fragmented heap, for the next file


def _answer(result: list[Any]) -> bytes:
    return pickle.dumps(result, pickle.HIGHEST_PROTOCOL)


def _limit_memory(extra_bytes: int) -> None:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[0])
    limit = pages * resource.getpagesize() + extra_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def main() -> None:
    # The server stops this process itself; a Ctrl-C to the terminal's process group must not.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError, ValueError, IndexError):
        _limit_memory(int(sys.argv[1]))
    answers = os.fdopen(os.dup(1), "wb")
    # Anything else printed goes to stderr (the server's log), never into the answers.
    os.dup2(2, 1)
    _serve(sys.stdin.buffer, answers)


if __name__ == "__main__":
    main()
