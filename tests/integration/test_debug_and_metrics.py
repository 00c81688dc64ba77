"""The /debug endpoints and /metrics, in istiod's shapes, against a live proxy."""

from __future__ import annotations

import pytest
from support.kube import istio, workload
from support.wait import eventually

from meshpilot import __version__

pytestmark = [pytest.mark.envoy, pytest.mark.integration]


@pytest.fixture
def live(mesh):
    mesh.write(
        "apps.yaml",
        [
            *workload("reviews", "default", "10.96.0.20", 9080, {"reviews-v1": "127.0.0.21"}),
            istio(
                "VirtualService",
                "reviews",
                "default",
                {"hosts": ["reviews"], "http": [{"route": [{"destination": {"host": "reviews"}}]}]},
            ),
            istio("Sidecar", "reviews", "default", {"egress": [{"bind": "127.0.0.21", "hosts": ["./*"]}]}),
        ],
    )
    mp = mesh.start_meshpilot()
    # The node metadata's labels differ from the pod's, to show which ones meshpilot uses.
    envoy = mesh.sidecar(
        "reviews-v1", "127.0.0.21", labels={"app": "reviews", "from": "metadata"}, service_account="reviews"
    )
    return mp, envoy


def test_syncz_shows_acked_nonces(live):
    mp, _ = live

    def synced():
        [status] = mp.get_json("/debug/syncz")
        return status if status["cluster_acked"] == status["cluster_sent"] else None

    status = eventually(synced, what="CDS acked")
    assert status["proxy"] == "reviews-v1.default"
    assert status["proxy_type"] == "sidecar"
    assert status["cluster_id"] == "Kubernetes"
    assert status["istio_version"] == "1.28.0"
    assert status["listener_acked"] == status["listener_sent"]
    assert status["resources"]["type.googleapis.com/envoy.config.cluster.v3.Cluster"]["sentTime"]
    assert mp.get_json("/debug/syncz?namespace=other") == []


def test_config_dump_matches_what_envoy_has(live):
    mp, envoy = live
    status, _body = mp.get("/debug/config_dump")
    assert status == 400
    assert mp.get("/debug/config_dump?proxyID=nobody")[0] == 404
    dump = mp.get_json("/debug/config_dump?proxyID=reviews-v1.default&include_eds")
    sections = {c["@type"].rsplit(".", 1)[1]: c for c in dump["configs"]}
    # istiod's sections, in its order.
    assert list(sections) == [
        "BootstrapConfigDump",
        "ClustersConfigDump",
        "EndpointsConfigDump",
        "ListenersConfigDump",
        "ScopedRoutesConfigDump",
        "RoutesConfigDump",
        "SecretsConfigDump",
        "EcdsConfigDump",
    ]
    ours = {c["cluster"]["name"] for c in sections["ClustersConfigDump"]["dynamic_active_clusters"]}
    assert ours == envoy.dynamic_clusters()


def test_configz_registryz_endpointz_adsz(live):
    mp, _ = live
    configs = mp.get_json("/debug/configz")
    assert {(c["kind"], c["metadata"]["name"]) for c in configs} == {
        ("VirtualService", "reviews"),
        ("Sidecar", "reviews"),
    }
    vs = next(c for c in configs if c["kind"] == "VirtualService")
    assert vs["apiVersion"] == "networking.istio.io/v1"
    assert vs["spec"]["hosts"] == ["reviews"]
    [svc] = mp.get_json("/debug/registryz")
    assert svc["hostname"] == "reviews.default.svc.cluster.local"
    assert svc["ports"] == [{"name": "http", "port": 9080, "protocol": "HTTP"}]
    assert svc["Attributes"]["ServiceRegistry"] == "Kubernetes"
    shards = mp.get_json("/debug/endpointz")
    [ep] = shards["reviews.default.svc.cluster.local"]["default"]["Shards"]["Kubernetes/Kubernetes"]
    assert ep["Addresses"] == ["127.0.0.21"] and ep["EndpointPort"] == 9080
    assert ep["ServiceAccount"] == "spiffe://cluster.local/ns/default/sa/reviews"
    ads = mp.get_json("/debug/adsz")
    assert ads["totalClients"] == 1
    [client] = ads["clients"]
    assert client["connectionId"].startswith("reviews-v1.default-")
    # The pod's labels, not the node metadata's, plus the topology labels istiod adds to a proxy's.
    assert client["labels"] == {"app": "reviews", "topology.istio.io/cluster": "Kubernetes"}
    assert "type.googleapis.com/envoy.config.cluster.v3.Cluster" in client["watches"]
    # The same handlers serve on the monitoring port.
    assert mp.get("/debug/adsz", mp.monitoring_port)[0] == 200


def test_metrics_have_istiod_names(live):
    mp, _ = live
    metrics = eventually(
        lambda: (m := mp.metrics()) and m.get('pilot_xds{version="1.28.0"}') == 1 and m,
        what="one connected proxy",
    )
    for name in (
        'pilot_xds_pushes{type="cds"}',
        'pilot_xds_pushes{type="lds"}',
        "pilot_services",
        "pilot_virt_services",
        "pilot_proxy_convergence_time_count",
        "pilot_xds_push_time_count",
    ):
        assert any(key.startswith(name) for key in metrics), name
    assert metrics["pilot_services"] == 1
    assert metrics["pilot_virt_services"] == 1
    assert not any(key.startswith("pilot_xds_pushes_total") for key in metrics), (
        "counters keep istiod's names"
    )
    assert not any("_created" in key for key in metrics), "istiod exports no _created series"
    assert "sidecar_injection_requests_total" in metrics, "the injector's counters keep their _total"
    # What the control-plane dashboard reads besides pilot_*: the build and the process.
    assert metrics[f'istio_build{{component="pilot",tag="{__version__}"}}'] == 1
    assert metrics["process_cpu_seconds_total"] > 0, "the process collector's counter keeps its _total"
    assert metrics["process_resident_memory_bytes"] > 0
    assert metrics["process_open_fds"] > 0
    assert 'python_gc_collections_total{generation="2"}' in metrics, "the collector's work is exported"
    before = metrics.get('pilot_push_triggers{type="debug"}', 0)
    assert mp.get("/debug/adsz?push=true")[0] == 200
    eventually(lambda: mp.metric('pilot_push_triggers{type="debug"}') > before, what="forced push counted")
    _status, body = mp.get("/metrics", mp.monitoring_port)
    assert b"# TYPE pilot_xds_pushes counter" in body
