"""A real Envoy sidecar (INTERCEPTION_MODE NONE) routing real HTTP on loopback, configured by files."""

from __future__ import annotations

from collections import Counter

import pytest
from support.kube import egress_sidecar, istio, namespace, workload
from support.processes import backend_name
from support.wait import eventually

pytestmark = [pytest.mark.envoy, pytest.mark.integration]

CLIENT_IP = "127.0.0.11"


def base_config(mesh) -> None:
    mesh.write("namespace.yaml", [namespace("default")])
    mesh.write(
        "productpage.yaml",
        workload("productpage", "default", "10.96.0.10", 9080, {"productpage-v1": CLIENT_IP}),
    )
    mesh.write(
        "reviews.yaml",
        workload(
            "reviews",
            "default",
            "10.96.0.20",
            9080,
            {"reviews-v1": "127.0.0.21", "reviews-v2": "127.0.0.22"},
            versions={"reviews-v1": "v1", "reviews-v2": "v2"},
        ),
    )
    mesh.write(
        "ratings.yaml", workload("ratings", "default", "10.96.0.30", 9080, {"ratings-v1": "127.0.0.31"})
    )
    mesh.write(
        "sidecar.yaml",
        [egress_sidecar("productpage", CLIENT_IP)],
    )


def start_backends(mesh) -> None:
    mesh.backend("reviews-v1", "127.0.0.21", 9080)
    mesh.backend("reviews-v2", "127.0.0.22", 9080)
    mesh.backend("ratings-v1", "127.0.0.31", 9080)


def call(host: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    return backend_name(CLIENT_IP, host, headers=headers)


def spread(host: str, n: int = 40, headers: dict[str, str] | None = None) -> Counter[str]:
    return Counter(call(host, headers)[1] for _ in range(n))


@pytest.fixture
def client(mesh):
    base_config(mesh)
    start_backends(mesh)
    mesh.start_meshpilot()
    return mesh.sidecar(
        "productpage-v1", CLIENT_IP, labels={"app": "productpage"}, service_account="productpage"
    )


def test_routes_by_host_to_the_right_backend(mesh, client):
    assert call("ratings") == (200, "ratings-v1")
    assert call("ratings.default.svc.cluster.local") == (200, "ratings-v1")
    assert call("ratings.default:9080") == (200, "ratings-v1")
    assert set(spread("reviews")) == {"reviews-v1", "reviews-v2"}
    status, _ = call("unknown.example.com")
    assert status != 200
    assert client.rejected_updates() == {}
    clusters = client.dynamic_clusters()
    assert {
        "outbound|9080||reviews.default.svc.cluster.local",
        "outbound|9080||ratings.default.svc.cluster.local",
        "BlackHoleCluster",
        "PassthroughCluster",
        "InboundPassthroughCluster",
    } <= clusters


def test_virtual_service_and_destination_rule_change_where_traffic_goes(mesh, client):
    assert set(spread("reviews")) == {"reviews-v1", "reviews-v2"}
    dr = istio(
        "DestinationRule",
        "reviews",
        "default",
        {
            "host": "reviews",
            "subsets": [
                {"name": "v1", "labels": {"version": "v1"}},
                {"name": "v2", "labels": {"version": "v2"}},
            ],
        },
    )
    vs = istio(
        "VirtualService",
        "reviews",
        "default",
        {
            "hosts": ["reviews"],
            "http": [
                {
                    "match": [{"headers": {"end-user": {"exact": "jason"}}}],
                    "route": [{"destination": {"host": "reviews", "subset": "v1"}}],
                },
                {"route": [{"destination": {"host": "reviews", "subset": "v2"}}]},
            ],
        },
    )
    mesh.write("routing.yaml", [dr, vs])
    eventually(
        lambda: spread("reviews", 20) == Counter({"reviews-v2": 20}), timeout=10, what="all traffic on v2"
    )
    assert spread("reviews", 10, {"end-user": "jason"}) == Counter({"reviews-v1": 10})

    vs["spec"]["http"] = [{"route": [{"destination": {"host": "reviews", "subset": "v1"}}]}]
    mesh.write("routing.yaml", [dr, vs])
    eventually(
        lambda: spread("reviews", 20) == Counter({"reviews-v1": 20}), timeout=10, what="all traffic on v1"
    )
    assert client.rejected_updates() == {}


def test_deleting_a_service_removes_its_cluster(mesh, client):
    cluster = "outbound|9080||ratings.default.svc.cluster.local"
    assert cluster in client.dynamic_clusters()
    mesh.remove("ratings.yaml")
    eventually(lambda: cluster not in client.dynamic_clusters(), timeout=10, what="ratings cluster removed")
    assert call("reviews")[0] == 200
    assert client.rejected_updates() == {}


def test_a_bad_object_is_reported_and_everything_else_keeps_working(mesh, client):
    mp = mesh.meshpilot
    good = istio(
        "DestinationRule",
        "ratings",
        "default",
        {"host": "ratings", "subsets": [{"name": "v1", "labels": {"app": "ratings"}}]},
    )
    bad = istio(
        "VirtualService",
        "reviews",
        "default",
        {
            "hosts": ["reviews"],
            "http": [{"timeout": "5 minutes", "route": [{"destination": {"host": "reviews"}}]}],
        },
    )
    path = mesh.write("mixed.yaml", [good, bad])
    eventually(
        lambda: "outbound|9080|v1|ratings.default.svc.cluster.local" in client.dynamic_clusters(),
        timeout=10,
        what="the valid DestinationRule applied",
    )
    log = mp.log()
    assert f"{path}[doc 1]" in log
    assert "VirtualService default/reviews rejected" in log
    assert "invalid duration '5 minutes'" in log
    assert mp.metric("meshpilot_config_rejected_objects") == 1
    assert set(spread("reviews")) == {"reviews-v1", "reviews-v2"}

    bad["spec"]["http"][0]["timeout"] = "5m"
    bad["spec"]["http"][0]["route"] = [{"destination": {"host": "ratings"}}]
    mesh.write("mixed.yaml", [good, bad])
    eventually(
        lambda: call("reviews") == (200, "ratings-v1"), timeout=10, what="the fixed VirtualService applied"
    )
    assert mp.metric("meshpilot_config_rejected_objects") == 0
    assert client.rejected_updates() == {}


def test_an_endpoint_change_pushes_only_eds(mesh, client):
    mp = mesh.meshpilot
    mesh.backend("reviews-v3", "127.0.0.23", 9080)
    cluster = "outbound|9080||reviews.default.svc.cluster.local"
    eventually(
        lambda: client.endpoints(cluster) == ["127.0.0.21:9080", "127.0.0.22:9080"], what="initial endpoints"
    )
    before = mp.metrics()
    mesh.write(
        "reviews.yaml",
        workload(
            "reviews",
            "default",
            "10.96.0.20",
            9080,
            {"reviews-v1": "127.0.0.21", "reviews-v2": "127.0.0.22", "reviews-v3": "127.0.0.23"},
            versions={"reviews-v1": "v1", "reviews-v2": "v2", "reviews-v3": "v3"},
        ),
    )
    eventually(
        lambda: "127.0.0.23:9080" in client.endpoints(cluster), timeout=10, what="new endpoint in Envoy"
    )
    eventually(lambda: "reviews-v3" in spread("reviews", 30), timeout=10, what="traffic to the new endpoint")
    after = mp.metrics()
    assert after['pilot_xds_pushes{type="eds"}'] > before.get('pilot_xds_pushes{type="eds"}', 0)
    assert after['pilot_xds_pushes{type="cds"}'] == before['pilot_xds_pushes{type="cds"}']
    assert after['pilot_xds_pushes{type="lds"}'] == before['pilot_xds_pushes{type="lds"}']
    assert after['pilot_push_triggers{type="endpoint"}'] > before.get(
        'pilot_push_triggers{type="endpoint"}', 0
    )
    assert client.rejected_updates() == {}
