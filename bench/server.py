"""The server under test, as a process whose CPU time and memory are read from /proc.

``ServerProcess`` runs meshpilot; ``bench.istiod.IstiodProcess`` runs istiod with the same probes.
"""

from __future__ import annotations

import http.client
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _ephemeral_floor() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


#: Ports this process handed out: two picks a moment apart (one server's gRPC and HTTP ports) must
#: not be the same port, which a random pick below the ephemeral range otherwise allows.
_HANDED_OUT: set[int] = set()


#: ``low-high``: the ports ``free_port`` picks from. `make test` gives each of its two concurrent
#: pytest runs its own range: ``_HANDED_OUT`` guards only one process's picks, and a port picked by
#: one run but not yet bound by its server could be picked and bound by the other.
PORT_RANGE_ENV = "MESHPILOT_TEST_PORT_RANGE"


def _port_range() -> tuple[int, int]:
    """Below the kernel's ephemeral range: a port the kernel hands out (bind to 0) is also what it
    gives the next outgoing connection, which can take it before the server binds."""
    top = _ephemeral_floor() - 1
    low, high = max(1024, top - 12000), top
    wanted = os.environ.get(PORT_RANGE_ENV, "")
    if wanted:
        try:
            first, last = (int(part) for part in wanted.split("-"))
        except ValueError:
            raise ValueError(f"{PORT_RANGE_ENV}={wanted!r}: expected low-high, as 20000-25999") from None
        low, high = max(1024, first), min(top, last)
        if low > high:
            raise ValueError(f"{PORT_RANGE_ENV}={wanted!r} leaves no port between 1024 and {top}")
    return low, high


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now, for a server started a moment later (from ``_port_range``)."""
    low, high = _port_range()
    for _ in range(200):
        port = random.randint(low, high)
        if port in _HANDED_OUT:
            continue  # free now, but promised to a server that may not have bound it yet
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            _HANDED_OUT.add(port)
            return port
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    #: What the results and errors call this server.
    name = "meshpilot"

    def __init__(
        self,
        config_dir: Path,
        workdir: Path,
        *,
        extra: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.grpc_port, self.http_port, self.monitoring_port = free_port(), free_port(), free_port()
        self.argv = [
            sys.executable,
            "-m",
            "meshpilot.cli.main",
            "discovery",
            "--config-dir",
            str(config_dir),
            "--grpc-addr",
            f"127.0.0.1:{self.grpc_port}",
            "--http-addr",
            f"127.0.0.1:{self.http_port}",
            "--monitoring-addr",
            f"127.0.0.1:{self.monitoring_port}",
            # The webhooks are not benchmarked; off, so :15017 is never bound on every interface.
            "--webhook-addr",
            "off",
            # The secure port's TLS is measured by the CA benchmark, not by the push benchmarks.
            "--secure-grpc-addr",
            "off",
            "--log-level",
            "warn",
            # The single process the push benchmarks measure; the pool benchmark asks for workers.
            "--push-workers",
            "1",
            *(extra or []),
        ]
        self.env = {**os.environ, **(env or {})}
        self.log = workdir / "meshpilot.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self, timeout: float = 600) -> float:
        """Start and wait for /ready; returns seconds until ready."""
        started = time.time()
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, env=self.env)
        while time.time() - started < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log.read_text()[-2000:]}")
            try:
                if self.get("/ready")[0] == 200:
                    return time.time() - started
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} not ready after {timeout} s (log: {self.log})")

    def get(self, path: str, port: int | None = None, timeout: float = 10) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", port or self.http_port, timeout=timeout)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def ready_latency(self) -> float:
        started = time.perf_counter()
        self.get("/ready")
        return time.perf_counter() - started

    def metrics(self) -> dict[str, float]:
        _, body = self.get("/metrics", self.monitoring_port)
        out = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        return process_cpu_seconds(self.proc.pid)

    def memory(self) -> dict[str, float]:
        """Current and peak resident memory in MiB."""
        assert self.proc is not None
        out: dict[str, Any] = {}
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":", 1)
                out["rss_mib" if key == "VmRSS" else "peak_rss_mib"] = int(value.split()[0]) / 1024
        return out

    def restart(self, timeout: float = 600) -> float:
        """Stop and start again on the same ports (a control-plane restart); seconds until ready."""
        self.stop()
        return self.start(timeout)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode
