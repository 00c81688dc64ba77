"""The CA benchmark (bench.ca) end to end at a tiny size: a few CSRs signed per key pair, and a storm
of 20 workloads against a real ``meshpilot discovery`` on its client-certificate port."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import ca, report
from bench.ca_job import CaJob

pytestmark = pytest.mark.integration


@pytest.mark.timeout(120)
def test_ca_benchmark_signs_serves_a_small_storm_and_reports_it(tmp_path: Path) -> None:
    result = ca.run(CaJob(sign_count=3, workloads=20, csr_key="ecdsa", timeout=60), tmp_path)

    pairs = {(s["ca_key"], s["csr_key"]) for s in result["signing"]}
    assert pairs == {("rsa", "rsa"), ("rsa", "ecdsa"), ("ecdsa", "rsa"), ("ecdsa", "ecdsa")}
    assert all(s["count"] == 3 and s["cpu_seconds"] > 0 for s in result["signing"])

    storm = result["storm"]
    assert storm["exit_code"] == 0
    assert storm["all_served"], storm["refused"]
    assert storm["certificates_issued"] == storm["streams_served"] == 20
    assert storm["empty_configs"] == 0
    assert storm["refused_otherwise"] == 0, storm["refused"]
    server = storm["server"]
    assert server["citadel_server_success_cert_issuance_count"] == 20
    assert server["citadel_server_csr_sign_err_count"] == 0
    assert server["meshpilot_xds_auth_failures"] == 0
    assert 0 < storm["all_certificates_seconds"] <= storm["all_streams_seconds"]
    assert storm["ready_probes"] > 0 and storm["ready_failures"] == 0

    results = {"suite": "smoke", "fleet": [], "storm": [], "ca": result}
    rendered = "\n".join(ca.section(results))
    assert "| ECDSA P-256 | RSA 2048 | 3 |" in rendered
    assert "| certificates issued / streams served | 20 / 20 of 20 |" in rendered
    assert [row[0] for row in ca.goals(results)] == [
        "20 workloads' certificate storm: /ready p99 latency",
        "20 workloads' certificate storm: /ready max latency",
    ]
    assert "### The mesh CA" in report.render({"smoke": results, "quick": results})
