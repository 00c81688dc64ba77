"""A TCP relay whose connections a test can cut: Envoy's xDS stream breaks, the server keeps running."""

from __future__ import annotations

import contextlib
import socket
import threading

from support.processes import free_port


class TcpRelay:
    """Listens on ``host``, forwards each connection to ``target``; ``cut()`` closes every open one."""

    def __init__(self, host: str, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port(host)
        self._listener = socket.create_server((host, self.port))
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.accepted = 0
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def start(self) -> TcpRelay:
        self._thread.start()
        return self

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self.accepted += 1
                self._open.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            self._close(source)
            self._close(sink)

    def _close(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.discard(sock)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()

    def cut(self) -> int:
        """Close every relayed connection; returns how many sockets were open."""
        with self._lock:
            open_now = list(self._open)
        for sock in open_now:
            self._close(sock)
        return len(open_now)

    def close(self) -> None:
        self._listener.close()
        self.cut()
