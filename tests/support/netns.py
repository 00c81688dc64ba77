"""Network namespaces for real-capture tests: created, joined by veth pairs, always deleted.

Everything happens inside namespaces the test creates, so the host's own interfaces,
routes and iptables are never touched.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Sequence

_TIMEOUT = 30.0


def unique_name(prefix: str) -> str:
    # Interface-name-like and short; unique so parallel runs never collide.
    return f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class NetworkNamespace:
    def __init__(self, prefix: str) -> None:
        self.name = unique_name(prefix)
        self.created = False

    def create(self) -> NetworkNamespace:
        subprocess.run(["ip", "netns", "add", self.name], check=True, timeout=_TIMEOUT)
        self.created = True
        self.ip("link", "set", "lo", "up")
        return self

    def delete(self) -> None:
        if self.created:
            subprocess.run(["ip", "netns", "delete", self.name], check=False, timeout=_TIMEOUT)
            self.created = False

    def prefix(self, uid: int | None = None) -> list[str]:
        """argv prefix running a command inside the namespace, as `uid` (and gid) when given."""
        argv = ["ip", "netns", "exec", self.name]
        if uid is not None:
            argv += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        return argv

    def run(
        self, argv: Sequence[str], *, uid: int | None = None, check: bool = True, timeout: float = _TIMEOUT
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [*self.prefix(uid), *argv], capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and done.returncode != 0:
            raise AssertionError(f"{argv} in {self.name} failed ({done.returncode}): {done.stderr}")
        return done

    def ip(self, *args: str) -> None:
        subprocess.run(["ip", "-n", self.name, *args], check=True, timeout=_TIMEOUT)


def veth(a: NetworkNamespace, a_addr: str, b: NetworkNamespace, b_addrs: Sequence[str]) -> None:
    """A veth pair `eth0` in each namespace (created inside `a`, so never on the host)."""
    a.ip("link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", b.name)
    a.ip("addr", "add", a_addr, "dev", "eth0")
    a.ip("link", "set", "eth0", "up")
    for addr in b_addrs:
        b.ip("addr", "add", addr, "dev", "eth0")
    b.ip("link", "set", "eth0", "up")
