"""EDS: endpoints grouped by locality, with Istio's metadata, filtered by subset."""

from __future__ import annotations

from envoy.config.endpoint.v3 import endpoint_pb2
from google.protobuf import json_format
from support.kube import istio, pod, workload
from support.mesh_objects import CLIENT, mesh_objects
from support.model import Model, build

from meshpilot.model.proxy import NodeMetadata, parse_proxy
from meshpilot.networking.cluster import ClusterInputs, build_clusters
from meshpilot.networking.endpoint import (
    build_cluster_load_assignment,
    cla_inputs,
    encode_cluster_load_assignment,
    proxy_signature,
)


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


def locality_docs(rule: dict | None = None, client_labels: dict | None = None) -> list[dict]:  # type: ignore[type-arg]
    """A client and reviews endpoints in three localities (Pod label istio-locality, as istiod reads it)."""
    docs = [
        *workload("productpage", "default", "10.96.0.10", 9080, {"productpage-v1": "10.1.0.11"}),
        *workload(
            "reviews",
            "default",
            "10.96.0.20",
            9080,
            {"reviews-a": "10.1.0.21", "reviews-b": "10.1.0.22", "reviews-c": "10.1.0.23"},
        ),
    ]
    where = {"reviews-a": "r1.z1", "reviews-b": "r1.z2", "reviews-c": "r2.z1", "productpage-v1": "r1.z1"}
    for doc in docs:
        if doc["kind"] == "Pod":
            doc["metadata"]["labels"]["istio-locality"] = where[doc["metadata"]["name"]]
            if doc["metadata"]["name"] == "productpage-v1":
                doc["metadata"]["labels"].update(client_labels or {})
    if rule is not None:
        docs.append(
            istio("DestinationRule", "reviews", "default", {"host": "reviews", "trafficPolicy": rule})
        )
    return docs


REVIEWS = "outbound|9080||reviews.default.svc.cluster.local"


def priorities_of(out: dict) -> dict[str, tuple[int, int]]:  # type: ignore[type-arg]
    """Endpoint address -> (group priority, group weight)."""
    return {
        e["endpoint"]["address"]["socketAddress"]["address"]: (g.get("priority", 0), g["loadBalancingWeight"])
        for g in out["endpoints"]
        for e in g.get("lbEndpoints", [])
    }


def test_failover_priorities_follow_the_calling_proxys_locality() -> None:
    model = build(locality_docs({"outlierDetection": {"consecutive5xxErrors": 3}}))
    assert model.proxy(CLIENT).locality.label == "r1/z1", "from the client Pod's istio-locality label"
    assert priorities_of(cla(model, REVIEWS)) == {
        "10.1.0.21": (0, 1),
        "10.1.0.22": (1, 1),
        "10.1.0.23": (2, 1),
    }
    no_outlier = build(locality_docs({"loadBalancer": {"simple": "ROUND_ROBIN"}}))
    assert set(priorities_of(cla(no_outlier, REVIEWS)).values()) == {(0, 1)}, (
        "no failover without outlier detection"
    )


def test_node_locality_is_used_when_the_registry_has_none() -> None:
    docs = [d for d in locality_docs({"outlierDetection": {"consecutive5xxErrors": 3}})]
    for doc in docs:
        if doc["kind"] == "Pod" and doc["metadata"]["name"] == "productpage-v1":
            del doc["metadata"]["labels"]["istio-locality"]
    model = build(docs)
    meta = NodeMetadata.parse({"NAMESPACE": "default"})
    proxy = parse_proxy(CLIENT, meta, locality="r2/z1")
    model.env.refresh_proxy(proxy, model.push)
    assert proxy.locality.label == "r2/z1"
    assert proxy.labels["topology.kubernetes.io/region"] == "r2", "topology labels added as istiod does"
    out = json_format.MessageToDict(build_cluster_load_assignment(REVIEWS, proxy, model.push, model.index))
    assert priorities_of(out) == {"10.1.0.23": (0, 1), "10.1.0.21": (1, 1), "10.1.0.22": (1, 1)}


def test_distribute_and_failover_priority_in_eds() -> None:
    distribute = {
        "loadBalancer": {"localityLbSetting": {"distribute": [{"from": "r1/z1/*", "to": {"r2/*": 100}}]}}
    }
    out = cla(build(locality_docs(distribute)), REVIEWS)
    groups = {g["locality"]["zone"] + g["locality"]["region"]: g for g in out["endpoints"]}
    assert groups["z1r2"]["loadBalancingWeight"] == 100
    assert "lbEndpoints" not in groups["z1r1"] and "lbEndpoints" not in groups["z2r1"], "others get nothing"
    rule = {
        "outlierDetection": {"consecutive5xxErrors": 3},
        "loadBalancer": {"localityLbSetting": {"failoverPriority": ["topology.kubernetes.io/zone"]}},
    }
    out = cla(build(locality_docs(rule)), REVIEWS)
    assert priorities_of(out) == {"10.1.0.21": (0, 1), "10.1.0.23": (0, 1), "10.1.0.22": (1, 1)}, (
        "same zone label as the caller first, whatever the region"
    )


def test_wire_encoding_equals_the_reference_with_locality_rewrites() -> None:
    rules = [
        {"outlierDetection": {"consecutive5xxErrors": 3}},
        {
            "loadBalancer": {
                "localityLbSetting": {"distribute": [{"from": "r1/*", "to": {"r1/z1": 70, "r2/*": 30}}]}
            }
        },
        {
            "outlierDetection": {"interval": "1s"},
            "loadBalancer": {
                "localityLbSetting": {
                    "failoverPriority": ["app"],
                    "failover": [{"from": "r1", "to": "r2"}],
                }
            },
        },
    ]
    for rule in rules:
        model = build(locality_docs(rule))
        proxy = model.proxy(CLIENT)
        reference = build_cluster_load_assignment(REVIEWS, proxy, model.push, model.index)
        encoded = endpoint_pb2.ClusterLoadAssignment.FromString(
            encode_cluster_load_assignment(REVIEWS, proxy, model.push, model.index)
        )
        assert encoded == reference, rule
        assert any(g.priority or g.load_balancing_weight.value > 1 for g in reference.endpoints), rule


def test_cache_keys_share_within_a_locality_and_differ_across() -> None:
    rule = {"outlierDetection": {"consecutive5xxErrors": 3}}
    others = [
        pod("other-1", "default", "10.1.0.12", {"app": "x", "istio-locality": "r1.z1"}),
        pod("other-2", "default", "10.1.0.13", {"app": "y", "istio-locality": "r2.z1"}),
    ]
    model = build([*locality_docs(rule), *others])

    def key(pod_name: str, ip: str) -> int:
        proxy = model.proxy(f"sidecar~{ip}~{pod_name}.default~default.svc.cluster.local")
        inputs = cla_inputs(REVIEWS, proxy, model.push)
        assert inputs is not None
        return inputs.cache_key(REVIEWS)

    same_locality = key("productpage-v1", "10.1.0.11"), key("other-1", "10.1.0.12")
    assert same_locality[0] == same_locality[1], "labels that no rule reads do not split the cache"
    assert key("other-2", "10.1.0.13") != same_locality[0]
    plain = build(locality_docs())
    inputs = cla_inputs(REVIEWS, plain.proxy(CLIENT), plain.push)
    assert inputs is not None and inputs.locality is None, "no outlier detection: nothing per proxy"


def test_tls_mode_metadata_follows_the_first_subset_an_endpoint_matches() -> None:
    docs = [
        *mesh_objects(),
        istio(
            "DestinationRule",
            "reviews",
            "default",
            {
                "host": "reviews",
                "trafficPolicy": {"tls": {"mode": "SIMPLE"}},
                "subsets": [
                    {
                        "name": "v1",
                        "labels": {"version": "v1"},
                        "trafficPolicy": {"tls": {"mode": "DISABLE"}},
                    },
                    {
                        "name": "v2",
                        "labels": {"version": "v2"},
                        "trafficPolicy": {"tls": {"mode": "ISTIO_MUTUAL"}},
                    },
                ],
            },
        ),
    ]
    docs = [d for d in docs if not (d["kind"] == "DestinationRule" and d is not docs[-1])]
    for doc in docs:
        if doc["kind"] == "Pod" and doc["metadata"]["name"] == "reviews-v1":
            doc["metadata"]["labels"]["security.istio.io/tlsMode"] = "istio"
    model = build(docs)
    proxy = model.proxy(CLIENT)

    def marked(name: str) -> dict[str, bool]:
        reference = build_cluster_load_assignment(name, proxy, model.push, model.index)
        encoded = endpoint_pb2.ClusterLoadAssignment.FromString(
            encode_cluster_load_assignment(name, proxy, model.push, model.index)
        )
        assert encoded == reference
        return {
            e.endpoint.address.socket_address.address: "envoy.transport_socket_match"
            in e.metadata.filter_metadata
            for g in reference.endpoints
            for e in g.lb_endpoints
        }

    # Whatever the cluster: v1's sidecar endpoint unmarked by its subset's DISABLE, v2's
    # plain endpoint marked by ISTIO_MUTUAL.
    assert marked(REVIEWS) == {"10.1.0.21": False, "10.1.0.22": True}
    assert marked("outbound|9080|v2|reviews.default.svc.cluster.local") == {"10.1.0.22": True}
    # Without subset modes, SIMPLE leaves it to each endpoint's own label.
    for doc in docs:
        if doc["kind"] == "DestinationRule":
            for subset in doc["spec"]["subsets"]:
                del subset["trafficPolicy"]
    model = build(docs)
    proxy = model.proxy(CLIENT)
    assert marked(REVIEWS) == {"10.1.0.21": True, "10.1.0.22": False}


def test_proxy_signature_splits_shared_eds_only_when_locality_can_matter() -> None:
    others = [
        pod("other-1", "default", "10.1.0.12", {"app": "x", "istio-locality": "r2.z1"}),
    ]

    def signatures(rule: dict | None) -> tuple[object, object]:  # type: ignore[type-arg]
        model = build([*locality_docs(rule), *others])
        near = model.proxy(CLIENT)
        far = model.proxy("sidecar~10.1.0.12~other-1.default~default.svc.cluster.local")
        return proxy_signature(near, model.push), proxy_signature(far, model.push)

    near, far = signatures({"loadBalancer": {"simple": "RANDOM"}})
    assert near == far == (), "no outlier detection nor distribute anywhere: every proxy alike"
    near, far = signatures({"outlierDetection": {"consecutive5xxErrors": 3}})
    assert near != far
    rule = {
        "outlierDetection": {"consecutive5xxErrors": 3},
        "loadBalancer": {"localityLbSetting": {"failoverPriority": ["app"]}},
    }
    near, far = signatures(rule)
    assert near != far and near[2] == ("productpage",), "the failoverPriority label's value counts"


def test_prefer_close_traffic_distribution_orders_by_topology_without_a_rule() -> None:
    docs = locality_docs()
    for doc in docs:
        if doc["kind"] == "Service" and doc["metadata"]["name"] == "reviews":
            doc["spec"]["trafficDistribution"] = "PreferClose"
    model = build(docs)
    # The caller is in r1/z1: same zone first, then same region, then elsewhere; no outlier detection needed.
    assert priorities_of(cla(model, REVIEWS)) == {
        "10.1.0.21": (0, 1),
        "10.1.0.22": (1, 1),
        "10.1.0.23": (2, 1),
    }
    annotated = locality_docs()
    for doc in annotated:
        if doc["kind"] == "Service" and doc["metadata"]["name"] == "reviews":
            doc["metadata"]["annotations"] = {"networking.istio.io/traffic-distribution": "preferclose"}
    assert priorities_of(cla(build(annotated), REVIEWS)) == priorities_of(cla(model, REVIEWS))
    proxy = model.proxy(CLIENT)
    clusters = {c.name: c for c in build_clusters(ClusterInputs(proxy, model.push, model.index))}
    assert clusters[REVIEWS].common_lb_config.HasField("locality_weighted_lb_config")
