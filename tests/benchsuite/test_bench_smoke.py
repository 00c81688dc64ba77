"""The benchmark suite's own code, end to end on a tiny mesh.

A full run takes half an hour; these catch a broken phase (a renamed field,
a report column reading a result that is no longer written) in seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import report
from bench.run import COMPILED, FleetJob, StormJob, run_fleet, run_storm
from bench.scenario import Scenario

pytestmark = pytest.mark.integration

TINY = Scenario(name="tiny", services=3, endpoints_per_service=2, proxies=4, virtual_services=1)


@pytest.mark.timeout(180)
def test_fleet_run_measures_both_changes_and_reports_them(tmp_path: Path) -> None:
    result = run_fleet(FleetJob(TINY, (COMPILED,), steady_seconds=0.5), COMPILED, tmp_path)

    assert result["exit_code"] == 0
    assert result["empty_configs"] == 0
    for change in ("endpoint_added", "virtual_service_changed"):
        assert result[change]["converged"] == TINY.proxies, change
        assert result[change]["from_write_seconds"]["p99"] > 0
    # The endpoint push sends EDS to every proxy, and nothing else.
    assert result["endpoint_added"]["server"]["pushes"] == {'type="eds"': TINY.proxies}
    assert result["virtual_service_changed"]["server"]["send_time_seconds"]["mean"] >= 0

    results = {"suite": "smoke", "fleet": [{"scenario_spec": TINY.__dict__, **result}], "storm": []}
    rendered = "\n".join(report.fleet_section(results, []))
    assert "| tiny | 3/2/4 | compiled |" in rendered
    assert report.goals(results), "the goal rows read the fleet results"


@pytest.mark.timeout(240)
def test_storm_run_resyncs_every_stream_after_a_drop_and_a_restart(tmp_path: Path) -> None:
    result = run_storm(StormJob(TINY, timeout=120), tmp_path)

    for event in ("streams_dropped", "server_restarted"):
        phase = result[event]
        assert phase["empty_configs"] == 0, event
        assert phase["stream_attempts"] >= TINY.proxies, event
        assert phase["ready_failures"] == 0 or event == "server_restarted"
        assert isinstance(phase["streams_ended"], dict)
    rendered = "\n".join(report.storm_section({"storm": [{"scenario_spec": TINY.__dict__, **result}]}))
    assert "streams dropped" in rendered
    assert "server restarted" in rendered
