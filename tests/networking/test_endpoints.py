"""EDS: endpoints grouped by locality, with Istio's metadata, filtered by subset."""

from __future__ import annotations

from google.protobuf import json_format
from support.kube import istio, pod
from support.mesh_objects import CLIENT, mesh_objects
from support.model import Model, build

from meshpilot.networking.endpoint import build_cluster_load_assignment


def cla(model: Model, name: str) -> dict:  # type: ignore[type-arg]
    out = build_cluster_load_assignment(name, model.proxy(CLIENT), model.push, model.index)
    return json_format.MessageToDict(out)


def test_endpoints_with_metadata_and_locality() -> None:
    docs = mesh_objects()
    docs = [d for d in docs if not (d["kind"] == "Pod" and d["metadata"]["name"].startswith("reviews"))]
    docs += [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": "n1",
                "labels": {"topology.kubernetes.io/region": "us", "topology.kubernetes.io/zone": "us-1"},
            },
        },
        pod(
            "reviews-v1",
            "default",
            "10.1.0.21",
            {"app": "reviews", "version": "v1", "security.istio.io/tlsMode": "istio"},
            service_account="reviews",
            node="n1",
        ),
        pod(
            "reviews-v2",
            "default",
            "10.1.0.22",
            {"app": "reviews", "version": "v2"},
            service_account="reviews",
        ),
    ]
    out = cla(build(docs), "outbound|9080||reviews.default.svc.cluster.local")
    assert out["clusterName"] == "outbound|9080||reviews.default.svc.cluster.local"
    groups = out["endpoints"]
    assert [g.get("locality", {}) for g in groups] == [{}, {"region": "us", "zone": "us-1"}], (
        "sorted by locality"
    )
    assert [g["loadBalancingWeight"] for g in groups] == [1, 1]
    [plain] = groups[0]["lbEndpoints"]
    [meshed] = groups[1]["lbEndpoints"]
    assert meshed["endpoint"]["address"]["socketAddress"] == {"address": "10.1.0.21", "portValue": 9080}
    assert meshed["healthStatus"] == "HEALTHY"
    assert meshed["metadata"]["filterMetadata"]["envoy.transport_socket_match"] == {"tlsMode": "istio"}
    assert meshed["metadata"]["filterMetadata"]["istio"] == {
        "workload": "reviews-v1;default;reviews;v1;Kubernetes"
    }
    assert "envoy.transport_socket_match" not in plain["metadata"]["filterMetadata"]


def test_subsets_filter_by_labels(model: Model) -> None:
    out = cla(model, "outbound|9080|v2|reviews.default.svc.cluster.local")
    addresses = [
        e["endpoint"]["address"]["socketAddress"]["address"]
        for g in out["endpoints"]
        for e in g["lbEndpoints"]
    ]
    assert addresses == ["10.1.0.22"]


def test_unknown_clusters_and_subsets_get_an_empty_assignment(model: Model) -> None:
    assert cla(model, "outbound|9080||nope.default.svc.cluster.local") == {
        "clusterName": "outbound|9080||nope.default.svc.cluster.local"
    }
    assert cla(model, "outbound|9080|v9|reviews.default.svc.cluster.local") == {
        "clusterName": "outbound|9080|v9|reviews.default.svc.cluster.local"
    }
    assert cla(model, "outbound|1234||reviews.default.svc.cluster.local") == {
        "clusterName": "outbound|1234||reviews.default.svc.cluster.local"
    }


def test_destination_rule_tls_mode_decides_the_mtls_metadata() -> None:
    docs = [
        *mesh_objects(),
        istio(
            "DestinationRule",
            "ratings",
            "other",
            {"host": "ratings.other.svc.cluster.local", "trafficPolicy": {"tls": {"mode": "ISTIO_MUTUAL"}}},
        ),
    ]
    out = cla(build(docs), "outbound|9080||ratings.other.svc.cluster.local")
    [endpoint] = out["endpoints"][0]["lbEndpoints"]
    assert endpoint["metadata"]["filterMetadata"]["envoy.transport_socket_match"] == {"tlsMode": "istio"}
