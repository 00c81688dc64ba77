"""The loader process: same objects as loading inline; a slow or bloating file costs it, not the server."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from support.kube import istio, write

from meshpilot.config.file_limits import MIB, FileLimits
from meshpilot.config.file_loader import load_file
from meshpilot.config.loader_process import ProcessLoader


def service_entries(count: int) -> list[dict[str, object]]:
    return [
        istio(
            "ServiceEntry",
            f"se-{i}",
            "default",
            {
                "hosts": [f"se-{i}.example.com"],
                "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
                "resolution": "STATIC",
                "endpoints": [{"address": f"10.1.{i // 256}.{i % 256}"}],
            },
        )
        for i in range(count)
    ]


async def test_a_file_loads_as_inline_in_the_child(tmp_path: Path) -> None:
    path = write(tmp_path / "se.yaml", [*service_entries(3), {"kind": "Nope"}])
    loader = ProcessLoader()
    try:
        loaded = await loader.load(path)
        assert loader.child_pid is not None and loader.child_pid != os.getpid()
        assert loaded == load_file(path)
        assert [d.obj.meta.name for d in loaded if d.obj is not None] == ["se-0", "se-1", "se-2"]
    finally:
        await loader.close()
    assert loader.child_pid is None


@pytest.mark.timeout(60)
async def test_a_file_over_its_time_is_rejected_and_the_next_loads(tmp_path: Path) -> None:
    slow = write(tmp_path / "slow.yaml", service_entries(3000))
    small = write(tmp_path / "small.yaml", service_entries(1))
    loader = ProcessLoader(FileLimits(seconds=0.2))
    try:
        await loader.load(small)  # the child has started: the next file's time is its own
        first = loader.child_pid
        started = time.monotonic()
        [rejected] = await loader.load(slow)
        assert time.monotonic() - started < 2.0
        assert rejected.rejection is not None and rejected.where == str(slow)
        assert rejected.rejection.reason == "loading took longer than the limit of 0.2 s; stopped"
        assert loader.child_pid is None, "the child was stopped"
        [again] = await loader.load(small)
        assert again.obj is not None and loader.child_pid not in (None, first)
    finally:
        await loader.close()


@pytest.mark.timeout(60)
async def test_a_file_over_the_memory_limit_fails_in_the_child(tmp_path: Path) -> None:
    big = write(tmp_path / "big.yaml", service_entries(20000))  # ~6 MB: about 150 MB decoded
    small = write(tmp_path / "small.yaml", service_entries(1))
    loader = ProcessLoader(FileLimits(memory_bytes=40 * MIB))
    try:
        [rejected] = await loader.load(big)
        assert rejected.rejection is not None
        assert "memory" in rejected.rejection.reason, rejected.rejection.reason
        [again] = await loader.load(small)
        assert again.obj is not None
    finally:
        await loader.close()


@pytest.mark.timeout(60)
async def test_close_ends_a_load_in_progress(tmp_path: Path) -> None:
    slow = write(tmp_path / "slow.yaml", service_entries(5000))
    loader = ProcessLoader()
    load = asyncio.create_task(loader.load(slow))
    for _ in range(200):
        if loader.child_pid is not None:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)
    started = time.monotonic()
    await loader.close()
    [rejected] = await asyncio.wait_for(load, 5)
    assert time.monotonic() - started < 2.0
    assert rejected.rejection is not None and "ended" in rejected.rejection.reason
