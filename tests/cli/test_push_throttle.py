"""--push-throttle (PILOT_PUSH_THROTTLE): 0 is automatic; a negative value is refused at start, not
left to stall every push."""

from __future__ import annotations

import os

import pytest

from meshpilot.cli.main import build_parser
from meshpilot.pool.supervisor import worker_settings
from meshpilot.push.throttle import PushSlots
from meshpilot.server.settings import DiscoverySettings
from meshpilot.xds.server import default_push_throttle


def test_zero_is_the_default_and_a_count_is_taken() -> None:
    parser = build_parser()
    assert parser.parse_args(["discovery"]).push_throttle == 0
    assert parser.parse_args(["discovery", "--push-throttle", "7"]).push_throttle == 7


@pytest.mark.parametrize("value", ["-1", "many"])
def test_a_negative_or_unreadable_throttle_is_refused(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["discovery", "--push-throttle", value])
    assert "invalid push throttle" in capsys.readouterr().err


def test_the_variable_is_checked_as_the_flag_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PILOT_PUSH_THROTTLE", "-2")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["discovery"])


def test_slots_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        PushSlots(0)


def test_the_automatic_throttle_does_not_follow_the_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    # istiod's min(15 + 5 per CPU, 100) would be 25 on 2 CPUs: its pushes run on every CPU, a
    # process's here on one event loop (xds.server.default_push_throttle).
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert default_push_throttle() == 100
    # Each of a pool's loops has the automatic value; a value the operator set is shared among them.
    assert worker_settings(DiscoverySettings(), 4).push_throttle == 100
    assert worker_settings(DiscoverySettings(push_throttle=7), 2).push_throttle == 4
