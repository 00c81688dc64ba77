"""The push-worker pool's benchmark job (bench.pool_bench), end to end on a tiny mesh."""

from __future__ import annotations

import pytest

from bench import pool_bench, report
from bench.scenario import Scenario

pytestmark = pytest.mark.integration

TINY = Scenario(name="tiny", services=3, endpoints_per_service=2, proxies=6, virtual_services=1)


@pytest.mark.timeout(240)
def test_pool_job_measures_every_process_and_reports_both_sizes() -> None:
    result = pool_bench.run(pool_bench.PoolJob(TINY, workers=(1, 2), rounds=1, settle_seconds=0.2))

    single, pool = result["runs"]
    assert [single["workers"], pool["workers"]] == [1, 2]
    for run in (single, pool):
        assert run["exit_code"] == 0
        assert sum(run["streams_per_worker"]) == TINY.proxies, run
        for change, _ in pool_bench.CHANGES:
            assert [r["converged"] for r in run[change]] == [TINY.proxies], change
    # The single process is its own worker; the pool has a main process and one figure per worker.
    assert single["rss_mib"]["workers"] == [] and single["rss_mib"]["main"] > 0
    assert len(pool["rss_mib"]["workers"]) == 2 and all(m > 0 for m in pool["rss_mib"]["workers"])
    assert len(pool["endpoint_added"][0]["worker_cpu_seconds"]) == 2
    assert len(pool["streams_per_worker"]) == 2

    results = {"suite": "smoke", "pool": [result]}
    rendered = "\n".join(pool_bench.section(results))
    assert "### The push-worker pool" in rendered and "| 2 |" in rendered
    # Two goal rows per change, none for a change whose tiny push used no CPU tick in the single process.
    assert len(pool_bench.goals(results)) in (0, 2, 4)
    assert "### The push-worker pool" in report.render({"quick": {"suite": "quick", **results}})
