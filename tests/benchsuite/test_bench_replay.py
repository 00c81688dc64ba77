"""The in-process push replay: every proxy syncs over delta and ACKs each change, and the report's
medians leave the first round out."""

from __future__ import annotations

from pathlib import Path

from bench.replay import CHANGES, RoundResult, replay, summary
from bench.scenario import Scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "bench" / "scenarios"


async def test_every_proxy_acks_each_change_in_every_round() -> None:
    scenario = Scenario.load(SCENARIOS / "http.yaml").scaled(0.01)  # 10 services, 20 proxies
    # A change ends only when every proxy has ACKed a response of the type it changes; a push that
    # missed one proxy would time out.
    results = await replay(scenario, 2, timeout=30)
    assert set(results) == set(CHANGES)
    for rounds in results.values():
        assert len(rounds) == 2
        for result in rounds:
            assert result.cpu_seconds > 0
            assert 0 < result.proxies_cpu_seconds < result.cpu_seconds


async def test_only_the_changes_asked_for_are_made() -> None:
    scenario = Scenario.load(SCENARIOS / "http.yaml").scaled(0.01)
    results = await replay(scenario, 1, timeout=30, changes=("virtual_service_changed",))
    assert list(results) == ["virtual_service_changed"]


def test_medians_leave_the_first_round_out() -> None:
    rounds = [RoundResult(9.0, 9.5, 1.0), RoundResult(1.0, 1.5, 0.25), RoundResult(3.0, 3.5, 0.75)]
    report = summary({"endpoint_added": rounds})["endpoint_added"]
    assert report["median_cpu_seconds"] == 2.0
    assert report["median_server_cpu_seconds"] == 1.5
    assert [r["cpu_seconds"] for r in report["rounds"]] == [9.0, 1.0, 3.0]
