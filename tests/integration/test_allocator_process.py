"""``meshpilot discovery`` runs on jemalloc when it is installed (``server.allocator``): the started
process, the same pid, has it mapped, and so do its push workers, which inherit the preload."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.kube import workload, write
from support.processes import Meshpilot
from support.wait import eventually

from meshpilot.server.allocator import find_jemalloc

pytestmark = pytest.mark.skipif(find_jemalloc() is None, reason="needs jemalloc (Debian: libjemalloc2)")


def _mapped(pid: int) -> bool:
    return "libjemalloc" in Path(f"/proc/{pid}/maps").read_text()


def _workers(pid: int) -> list[int]:
    """The server's children started by multiprocessing's spawn (its push workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and b"spawn_main" in cmdline:
            found.append(int(entry.name))
    return found


def test_the_server_and_its_push_workers_run_on_jemalloc(tmp_path: Path) -> None:
    config = tmp_path / "config"
    write(config / "apps.yaml", workload("reviews", "default", "10.96.0.20", 9080, {"r-1": "127.0.0.21"}))
    mp = Meshpilot(tmp_path, config, extra=["--push-workers", "2"])
    mp.start()
    try:
        mp.wait_ready()
        assert mp.proc is not None
        pid = mp.proc.pid
        assert _mapped(pid), "the server process itself, run again under the preload"
        assert "memory allocator: jemalloc (preloaded; MALLOC_CONF background_thread:true" in mp.log()
        workers = eventually(lambda: w if len(w := _workers(pid)) == 2 else [], timeout=30)
        assert all(_mapped(w) for w in workers), "workers inherit the preload"
    finally:
        mp.stop()


def test_the_operator_can_keep_the_system_allocator(tmp_path: Path) -> None:
    mp = Meshpilot(tmp_path, None, env={"MESHPILOT_ALLOCATOR": "system"})
    mp.start()
    try:
        mp.wait_ready()
        assert mp.proc is not None and not _mapped(mp.proc.pid)
        assert "memory allocator: system (MESHPILOT_ALLOCATOR=system)" in mp.log()
    finally:
        mp.stop()
