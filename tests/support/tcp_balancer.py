"""A TCP load balancer in front of server replicas, as a Kubernetes Service spreads connections.

Each new connection goes to the next backend in turn (round-robin, as kube-proxy's IPVS mode does);
a backend that refuses the connection (a replica that died) is skipped for the next one, as a Service
whose endpoint was removed no longer sends there. Backends are added as replicas become ready and
removed as they go (``set_backends``). Bytes are relayed unchanged both ways; a connection lasts
until either side closes it, or until the test cuts every one (``cut``: a client's stream breaks, its
server keeps running). With one backend it is a plain relay.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections import Counter

from support.processes import free_port

Backend = tuple[str, int]


class TcpBalancer:
    """Listens on ``host``; ``start()``, then ``close()``. Thread-safe."""

    def __init__(self, host: str, backends: list[Backend]) -> None:
        self.port = free_port(host)
        self._listener = socket.create_server((host, self.port))
        self._lock = threading.Lock()
        self._backends = list(backends)
        self._next = 0
        #: Connections relayed to each backend so far.
        self.accepted: Counter[Backend] = Counter()
        #: Open relayed connections: (client side, upstream side) -> backend.
        self._open: dict[tuple[socket.socket, socket.socket], Backend] = {}
        self._thread = threading.Thread(target=self._accept, daemon=True, name="tcp-balancer")

    def start(self) -> TcpBalancer:
        self._thread.start()
        return self

    def set_backends(self, backends: list[Backend]) -> None:
        """The backends new connections go to from now on (open ones stay where they are)."""
        with self._lock:
            self._backends = list(backends)
            self._next = 0

    def open_to(self, backend: Backend) -> int:
        """Connections now open to ``backend``."""
        with self._lock:
            return sum(1 for b in self._open.values() if b == backend)

    def _pick(self) -> list[Backend]:
        """The backends in the order to try for one new connection."""
        with self._lock:
            backends = self._backends
            if not backends:
                return []
            start = self._next % len(backends)
            self._next = start + 1
            return backends[start:] + backends[:start]

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            upstream, backend = self._connect()
            if upstream is None or backend is None:
                client.close()
                continue
            pair = (client, upstream)
            with self._lock:
                self.accepted[backend] += 1
                self._open[pair] = backend
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b, pair), daemon=True).start()

    def _connect(self) -> tuple[socket.socket | None, Backend | None]:
        for backend in self._pick():
            try:
                upstream = socket.create_connection(backend, timeout=2)
            except OSError:
                continue  # refused: the replica is gone
            upstream.settimeout(None)
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return upstream, backend
        return None, None

    def _pipe(
        self, source: socket.socket, sink: socket.socket, pair: tuple[socket.socket, socket.socket]
    ) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open.pop(pair, None)
            _close(pair)

    def cut(self) -> int:
        """Close every relayed connection; how many were open."""
        with self._lock:
            pairs = list(self._open)
            self._open.clear()
        for pair in pairs:
            _close(pair)
        return len(pairs)

    def close(self) -> None:
        self._listener.close()
        self.cut()


def _close(pair: tuple[socket.socket, socket.socket]) -> None:
    for sock in pair:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
