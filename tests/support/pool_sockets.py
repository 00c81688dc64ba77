"""Which process of a push-worker pool holds which xDS stream, read from the kernel: the processes
of the server (the main process and its descendants), the ones listening on the xDS port (the
workers: each has a SO_REUSEPORT socket of its own), and the server-side sockets of the
established connections each one holds."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_TCP_LISTEN = "0A"
_TCP_ESTABLISHED = "01"


def _process_tree(root: int) -> list[int]:
    """``root`` and every process descended from it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces: fields count from the last ")".
        ppid = int(stat.rpartition(")")[2].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _socket_inodes(pid: int) -> set[int]:
    inodes: set[int] = set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _sockets_on(port: int) -> dict[int, str]:
    """The kernel's TCP sockets whose local port is ``port``: inode -> state."""
    out = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local_port = int(fields[1].rpartition(":")[2], 16)
            if local_port == port and fields[9] != "0":
                out[int(fields[9])] = fields[3]
    return out


@dataclass(frozen=True)
class ServerSockets:
    """Who, among a server's processes, listens on the xDS port and holds which of its streams."""

    listening: frozenset[int]
    #: pid -> inodes of the established (server-side) connections it holds.
    streams: dict[int, frozenset[int]]

    @classmethod
    def read(cls, root: int, port: int) -> ServerSockets:
        sockets = _sockets_on(port)
        listening, streams = set(), {}
        for pid in _process_tree(root):
            held = _socket_inodes(pid)
            if any(sockets.get(i) == _TCP_LISTEN for i in held):
                listening.add(pid)
            streams[pid] = frozenset(i for i in held if sockets.get(i) == _TCP_ESTABLISHED)
        return cls(frozenset(listening), streams)

    def taken_since(self, before: ServerSockets) -> set[int]:
        """The processes that accepted a connection since ``before``."""
        return {pid for pid, held in self.streams.items() if held - before.streams.get(pid, frozenset())}
