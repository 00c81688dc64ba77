"""The server's garbage-collector settings: defaults, the environment override, bad values ignored."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from meshpilot.server import gc_tuning


@pytest.fixture(autouse=True)
def restore() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(gc_tuning.ENV, raising=False)
    assert gc_tuning.configure() == gc_tuning.DEFAULT_THRESHOLDS
    assert gc.get_threshold() == gc_tuning.DEFAULT_THRESHOLDS


def test_environment_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(gc_tuning.ENV, "700,10,10")
    assert gc_tuning.configure() == (700, 10, 10)
    assert gc.get_threshold() == (700, 10, 10)


@pytest.mark.parametrize("raw", ["fast", "1,2,3,4", "-5", "1,,2"])
def test_bad_values_are_ignored(
    monkeypatch: pytest.MonkeyPatch, raw: str, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(gc_tuning.ENV, raw)
    assert gc_tuning.configure() == gc_tuning.DEFAULT_THRESHOLDS
    assert gc_tuning.ENV in caplog.text
