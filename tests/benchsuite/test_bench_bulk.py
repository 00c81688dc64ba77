"""The bulk-config job (bench.bulk_config) end to end on a small file, and its report table."""

from __future__ import annotations

import pytest

from bench import bulk_config, report
from bench.run import suites

pytestmark = pytest.mark.integration


@pytest.mark.timeout(180)
def test_a_file_of_service_entries_reaches_the_canary_and_leaves_it() -> None:
    full = suites()["full"].bulk[0].scenario
    job = bulk_config.BulkJob(full.scaled(0.02))  # 200 ServiceEntries
    result = bulk_config.run(job)
    before = result["clusters_before"]
    assert result["objects"] == 200
    assert result["add"]["clusters"] == before + 200
    assert result["remove"]["clusters"] == before
    for change in ("add", "remove"):
        assert 0 < result[change]["push_seconds"] < 60
        assert 0 <= result[change]["loop_stall_seconds"] < result[change]["push_seconds"] + 1
    assert result["rss_mib_before"] > 0 and result["rss_mib_after_add"] > 0
    page = report.render({"full": {"suite": "full", "bulk": [result]}})
    assert "### Thousands of objects in one config file" in page
    assert "| 200 ServiceEntry | add |" in page
