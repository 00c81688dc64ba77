"""How many push workers ``--push-workers 0`` (the default) starts: the CPUs the process may use,
within its cgroup's limit, capped; one process where the kernel picks the xDS port."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest

from meshpilot.config.errors import ConfigError
from meshpilot.pool import sizing
from meshpilot.server.app import DiscoveryApp
from meshpilot.server.settings import Address, DiscoverySettings


def _files(base: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = base / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_cgroup_v2_limit_is_the_lowest_on_the_way_up(tmp_path: Path) -> None:
    _files(
        tmp_path,
        {
            "proc/cgroup": "0::/kubepods/pod1/ctr\n",
            "cg/kubepods/cpu.max": "max 100000\n",
            "cg/kubepods/pod1/cpu.max": "250000 100000\n",
            "cg/kubepods/pod1/ctr/cpu.max": "400000 100000\n",
        },
    )
    assert sizing.cgroup_cpu_limit(tmp_path / "cg", tmp_path / "proc") == 2.5


def test_cgroup_v1_quota_and_no_limit(tmp_path: Path) -> None:
    _files(
        tmp_path,
        {
            "proc/cgroup": "12:memory:/x\n4:cpu,cpuacct:/docker/abc\n0::/\n",
            "cg/cpu/docker/abc/cpu.cfs_quota_us": "150000\n",
            "cg/cpu/docker/abc/cpu.cfs_period_us": "100000\n",
        },
    )
    assert sizing.cgroup_cpu_limit(tmp_path / "cg", tmp_path / "proc") == 1.5
    (tmp_path / "cg/cpu/docker/abc/cpu.cfs_quota_us").write_text("-1\n")
    assert sizing.cgroup_cpu_limit(tmp_path / "cg", tmp_path / "proc") is None
    # No cgroup file at all (not Linux, or hidden): no limit.
    assert sizing.cgroup_cpu_limit(tmp_path / "cg", tmp_path / "nowhere") is None


def test_cgroup_v1_mounted_under_the_joined_name_and_v2_beside_it(tmp_path: Path) -> None:
    """Only ``cpu,cpuacct`` mounted (no ``cpu`` link); and a stale v1 ``cpu`` line whose files are
    not there beside a v2 limit: each limit is found."""
    _files(
        tmp_path,
        {
            "proc/cgroup": "4:cpu,cpuacct:/kubepods/x\n0::/\n",
            "cg/cpu,cpuacct/kubepods/x/cpu.cfs_quota_us": "300000\n",
            "cg/cpu,cpuacct/kubepods/x/cpu.cfs_period_us": "100000\n",
        },
    )
    assert sizing.cgroup_cpu_limit(tmp_path / "cg", tmp_path / "proc") == 3.0
    _files(tmp_path, {"proc2/cgroup": "4:cpu,cpuacct:/gone\n0::/svc\n", "cg/svc/cpu.max": "50000 100000\n"})
    assert sizing.cgroup_cpu_limit(tmp_path / "cg", tmp_path / "proc2") == 0.5


def test_usable_cores_rounds_the_limit_up_within_the_affinity(monkeypatch: pytest.MonkeyPatch) -> None:
    affinity = len(os.sched_getaffinity(0))
    monkeypatch.delenv("GOMAXPROCS", raising=False)
    monkeypatch.setattr(sizing, "cgroup_cpu_limit", lambda: 0.5)
    assert sizing.usable_cores({}) == 1
    monkeypatch.setattr(sizing, "cgroup_cpu_limit", lambda: 1.2)
    assert sizing.usable_cores({}) == min(affinity, 2)
    monkeypatch.setattr(sizing, "cgroup_cpu_limit", lambda: None)
    assert sizing.usable_cores({}) == affinity
    monkeypatch.setattr(sizing, "cgroup_cpu_limit", lambda: 64.0)
    assert sizing.usable_cores({}) == affinity
    # GOMAXPROCS, as Istio's chart sets it from the CPU limit: a bound, never more than the CPUs.
    assert sizing.usable_cores({"GOMAXPROCS": "1"}) == 1
    assert sizing.usable_cores({"GOMAXPROCS": "999"}) == affinity
    assert sizing.usable_cores({"GOMAXPROCS": "0"}) == sizing.usable_cores({"GOMAXPROCS": "x"}) == affinity
    assert sizing.default_workers() == min(affinity, sizing.MAX_DEFAULT_WORKERS)


def test_the_default_resolves_to_a_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sizing, "usable_cores", lambda: 16)
    fixed = DiscoverySettings(
        grpc_addr=Address("127.0.0.1", 15010),
        secure_grpc_addr=Address("127.0.0.1", 15012),
        push_workers=0,
    )
    assert sizing.resolve_workers(fixed).push_workers == sizing.MAX_DEFAULT_WORKERS
    monkeypatch.setattr(sizing, "usable_cores", lambda: 3)
    assert sizing.resolve_workers(fixed).push_workers == 3
    # A port the kernel picks would differ per worker: the default is one process then ...
    ephemeral = DiscoverySettings(grpc_addr=Address("127.0.0.1", 0), push_workers=0)
    assert sizing.resolve_workers(ephemeral).push_workers == 1
    # ... and an explicit count is kept, which the server refuses with such a port.
    assert sizing.resolve_workers(DiscoverySettings(push_workers=4)).push_workers == 4
    assert sizing.ephemeral_ports(ephemeral) == ["127.0.0.1:0"]
    with pytest.raises(ConfigError, match=re.escape("--push-workers 2 needs fixed xDS ports: 127.0.0.1:0")):
        DiscoveryApp(dataclasses.replace(ephemeral, push_workers=2))
    assert sizing.ephemeral_ports(fixed) == []
