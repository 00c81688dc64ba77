"""How many push workers a server runs: what ``--push-workers`` asks, or, by default (0), one per
core the process may use.

"May use" is the smallest of the CPUs it may be scheduled on, its cgroup's CPU limit rounded up (a
container limited to 2 CPUs on a 16-core node gets 2 workers) and ``GOMAXPROCS`` where it is set:
Istio's chart sets it from the container's CPU limit (the node's CPUs without one), and it bounds
istiod's threads. Go never sizes itself below 2 threads; below 2 CPUs meshpilot runs one process, since
a second worker would only take turns with the first. Each worker holds a copy of the model, so the
default is capped (``MAX_DEFAULT_WORKERS``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path

from meshpilot.server.settings import DiscoverySettings

log = logging.getLogger(__name__)

#: The most workers the default starts: past it, the main process (one core) feeding them the
#: change log and the debounce becomes the limit before the workers do, and memory grows per worker.
MAX_DEFAULT_WORKERS = 8
#: The most workers one may ask for: each holds the whole model, and the main process writes the
#: change log to each.
MAX_WORKERS = 64


def _cgroup_paths(proc_cgroup: str) -> dict[str, str]:
    """``/proc/self/cgroup`` as controller -> path ("" for the unified hierarchy)."""
    out = {}
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            out[controller] = path
    return out


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _ancestors(root: Path, path: str) -> list[Path]:
    """``root/path`` and each directory above it up to ``root``: a limit may be set on any of them."""
    parts = [p for p in path.split("/") if p]
    return [root.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]


def cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc/self")) -> float | None:
    """The CPUs this process's cgroup may use (quota / period), the lowest along its hierarchy;
    None without a limit. cgroup v2 (``cpu.max``) and v1 (``cpu.cfs_quota_us``) alike."""
    text = _read(proc / "cgroup")
    if text is None:
        return None
    paths = _cgroup_paths(text)
    limits: list[float] = []
    v1 = paths.get("cpu")
    if v1 is not None:
        # Mounted as "cpu" (usually a link to "cpu,cpuacct"), or only under the joined name.
        for mount in ("cpu", "cpu,cpuacct"):
            for directory in _ancestors(root / mount, v1):
                quota = _read(directory / "cpu.cfs_quota_us")
                period = _read(directory / "cpu.cfs_period_us")
                if quota and period and quota != "-1" and int(period) > 0:
                    limits.append(int(quota) / int(period))
    if "" in paths:
        for directory in _ancestors(root, paths[""]):
            fields = (_read(directory / "cpu.max") or "max").split()
            if fields[0] != "max" and len(fields) == 2 and int(fields[1]) > 0:
                limits.append(int(fields[0]) / int(fields[1]))
    return min(limits) if limits else None


def usable_cores(environ: Mapping[str, str] = os.environ) -> int:
    """The cores this process may use (see the module's docstring); at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    try:
        limit = cgroup_cpu_limit()
    except (OSError, ValueError):  # an unreadable or unexpected cgroup file: the CPUs it may run on
        limit = None
    if limit is not None:
        cores = min(cores, max(1, math.ceil(limit)))
    gomaxprocs = environ.get("GOMAXPROCS", "")
    # As Go reads it: ASCII digits only (``str.isdigit`` takes "²", which ``int`` refuses).
    if gomaxprocs.isascii() and gomaxprocs.isdigit() and int(gomaxprocs) > 0:
        cores = min(cores, int(gomaxprocs))
    return cores


def default_workers() -> int:
    """``--push-workers 0``: one per usable core, at most ``MAX_DEFAULT_WORKERS``."""
    return max(1, min(usable_cores(), MAX_DEFAULT_WORKERS))


def ephemeral_ports(settings: DiscoverySettings) -> list[str]:
    """The xDS addresses of ``settings`` whose port the kernel picks (":0")."""
    addresses = (settings.grpc_addr, settings.secure_grpc_addr, settings.secure_grpc_client_cert_addr)
    return [str(a) for a in addresses if a is not None and a.port == 0]


def resolve_workers(settings: DiscoverySettings) -> DiscoverySettings:
    """``settings`` with the worker count decided: 0 becomes one per usable core (a single process
    where ports are chosen by the kernel: each worker would get a port of its own). An explicit
    count above 1 with such a port is the caller's error (``DiscoveryApp`` says so)."""
    if settings.push_workers != 0:
        return settings
    workers = default_workers()
    ephemeral = ephemeral_ports(settings)
    if workers > 1 and ephemeral:
        log.info(
            "push workers: 1 (xDS port %s is picked by the kernel; workers need a fixed one)", ephemeral[0]
        )
        workers = 1
    else:
        log.info("push workers: %d (one per usable core, at most %d)", workers, MAX_DEFAULT_WORKERS)
    return dataclasses.replace(settings, push_workers=workers)
