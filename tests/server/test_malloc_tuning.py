"""The C allocator's settings: applied on glibc, left to the operator when glibc's own knobs are set.
What they are for (memory back to the system after a flood of large requests) is measured by
tests/integration/test_ads_flood.py."""

from __future__ import annotations

import platform

import pytest

from meshpilot.server import malloc_tuning


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_applied_on_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert malloc_tuning.configure()


@pytest.mark.parametrize("knob", ["MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_"])
def test_the_operators_settings_win(monkeypatch: pytest.MonkeyPatch, knob: str) -> None:
    monkeypatch.setenv(knob, "4")
    assert not malloc_tuning.configure()


def test_nothing_is_set_under_jemalloc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.setattr(malloc_tuning.allocator, "jemalloc_mapped", lambda: True)
    assert not malloc_tuning.configure()
