"""``python -m bench.run --peer istiod`` end to end on a tiny mesh: istiod and meshpilot side by side.

istiod is ``build/reference/bin/pilot-discovery`` (`make reference`); without it the test skips, or
fails where the referee is required (``support.reference``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.reference import binary

from bench import istiod, report
from bench.kube_stub import KubeStub
from bench.run import COMPILED, ISTIOD, FleetJob, Suite, run_fleet, run_peer
from bench.scenario import Scenario

TINY = Scenario(name="tiny", services=3, endpoints_per_service=2, proxies=4, virtual_services=1)


@pytest.mark.integration
@pytest.mark.reference
@pytest.mark.timeout(180)
def test_peer_run_measures_istiod_and_meshpilot_on_the_same_service_entries() -> None:
    assert binary("pilot-discovery") == istiod.BINARY
    suite = Suite(
        "tiny",
        micro_min_time=0.0,
        fleet=(FleetJob(TINY, (COMPILED,), steady_seconds=0.5, settle_seconds=0.5),),
        storm=(),
    )

    peer = run_peer(suite, ISTIOD, None)

    assert peer["version"] not in ("", "unknown")
    runs = {(run["server"], run["protocol"]): run for run in peer["runs"]}
    assert set(runs) == {(s, p) for s in ("istiod", "meshpilot") for p in ("sotw", "delta")}
    for (server, protocol), run in runs.items():
        where = (server, protocol)
        assert run["scenario"] == "tiny-se" and run["scenario_spec"]["service_entries"], where
        assert run["exit_code"] == 0, where
        assert run["empty_configs"] == 0, where
        assert run["sync_seconds"] > 0 and run["steady_rss_mib"] > 0, where
        for change in ("endpoint_added", "virtual_service_changed"):
            assert run[change]["converged"] == TINY.proxies, (where, change)
            assert run[change]["fan_out_seconds"]["p99"] >= 0, (where, change)
        # istiod reports its pushes under the metric names meshpilot uses.
        assert run["endpoint_added"]["server"]["pushes"].get('type="eds"') == TINY.proxies, where
    for protocol in ("sotw", "delta"):
        istiod_run, ours = runs[("istiod", protocol)], runs[("meshpilot", protocol)]
        # Both servers gave the first sidecar resources of the same names: the same work to compare.
        assert istiod_run["resource_names_digest"] == ours["resource_names_digest"], protocol
        assert istiod_run["resources_per_proxy"]["cluster"] == TINY.services + 3  # BlackHole, Passthrough x2

    rendered = "\n".join(report.peer_section({"peer": peer}))
    assert "### Beside istiod" in rendered
    assert "| measure | istiod | meshpilot | meshpilot / istiod |" in rendered
    assert "| same resource names as istiod's | - | yes | - |" in rendered
    assert "| endpoint added: proxies converged | 4/4 | 4/4 | - |" in rendered
    assert "**tiny-se, delta sidecars**" in rendered
    assert "**tiny-se, state-of-the-world sidecars**" in rendered


def test_service_entry_form_has_the_kubernetes_form_s_services_and_endpoints() -> None:
    kube, entries = TINY, Scenario(**{**TINY.__dict__, "service_entries": True})
    for s in range(TINY.services):
        (entry,) = entries.service_objects(s)
        service, *pods, slice_ = kube.service_objects(s)
        assert entry["kind"] == "ServiceEntry" and entry["spec"]["resolution"] == "STATIC"
        assert entry["spec"]["hosts"] == [kube.hostname(s)]
        assert entry["spec"]["addresses"] == [service["spec"]["clusterIP"]]
        assert [p["number"] for p in entry["spec"]["ports"]] == [p["port"] for p in service["spec"]["ports"]]
        assert [e["address"] for e in entry["spec"]["endpoints"]] == [p["status"]["podIP"] for p in pods]
        assert [e["addresses"][0] for e in slice_["endpoints"]] == [p["status"]["podIP"] for p in pods]
    # The sidecars are clients: their addresses back no service.
    addresses = {
        e["address"] for s in range(TINY.services) for e in entries.service_objects(s)[0]["spec"]["endpoints"]
    }
    assert not {entries.proxy(i)[1] for i in range(TINY.proxies)} & addresses


@pytest.mark.integration
@pytest.mark.reference
@pytest.mark.timeout(60)
def test_istiod_needs_the_empty_api_server_and_reports_what_it_is(tmp_path: Path) -> None:
    binary("pilot-discovery")
    with pytest.raises(ValueError, match="kube_stub"):
        run_fleet(FleetJob(TINY, (ISTIOD,)), ISTIOD, tmp_path)
    with KubeStub(tmp_path / "kube") as kube:
        assert "server: 'http://127.0.0.1:" in kube.kubeconfig.read_text()
