"""DestinationRule load balancing seen from a real Envoy: outlier ejection, locality failover and weights.

The client sidecar's locality comes from its bootstrap node (as pilot-agent
writes it); endpoint localities come from the Pods' ``istio-locality`` label,
as istiod reads them.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from support.kube import egress_sidecar, istio, namespace, workload
from support.processes import backend_name, http_get
from support.wait import eventually

pytestmark = [pytest.mark.envoy, pytest.mark.integration]

CLIENT_IP = "127.0.3.11"
NEAR_IP = "127.0.3.21"
FAR_IP = "127.0.3.22"
CLUSTER = "outbound|9080||reviews.default.svc.cluster.local"


def with_pod_labels(docs: list[dict[str, Any]], labels: dict[str, dict[str, str]]) -> list[dict[str, Any]]:
    """The workload's documents with extra labels on the named Pods."""
    for doc in docs:
        if doc["kind"] == "Pod" and doc["metadata"]["name"] in labels:
            doc["metadata"]["labels"].update(labels[doc["metadata"]["name"]])
    return docs


def write_mesh(mesh, traffic_policy: dict[str, Any], **service_spec: Any) -> None:
    mesh.write("namespace.yaml", [namespace("default")])
    mesh.write(
        "productpage.yaml",
        workload("productpage", "default", "10.96.0.10", 9080, {"productpage-v1": CLIENT_IP}),
    )
    reviews = workload(
        "reviews", "default", "10.96.0.20", 9080, {"reviews-near": NEAR_IP, "reviews-far": FAR_IP}
    )
    reviews[0]["spec"].update(service_spec)
    # Pod label istio-locality is region.zone (dots, as on Kubernetes labels).
    reviews = with_pod_labels(
        reviews,
        {
            "reviews-near": {"istio-locality": "region1.zone1"},
            "reviews-far": {"istio-locality": "region2.zone2"},
        },
    )
    mesh.write("reviews.yaml", reviews)
    mesh.write(
        "sidecar.yaml",
        [egress_sidecar("productpage", CLIENT_IP)],
    )
    mesh.write(
        "reviews-dr.yaml",
        [
            istio(
                "DestinationRule", "reviews", "default", {"host": "reviews", "trafficPolicy": traffic_policy}
            )
        ],
    )


def start(mesh, traffic_policy: dict[str, Any], **service_spec: Any):
    write_mesh(mesh, traffic_policy, **service_spec)
    near = mesh.backend("reviews-near", NEAR_IP, 9080)
    far = mesh.backend("reviews-far", FAR_IP, 9080)
    mesh.start_meshpilot()
    client = mesh.sidecar(
        "productpage-v1",
        CLIENT_IP,
        labels={"app": "productpage"},
        service_account="productpage",
        locality="region1/zone1",
    )
    eventually(lambda: len(client.endpoints(CLUSTER)) == 2, timeout=20, what="both reviews endpoints")
    return client, near, far


def call() -> tuple[int, str]:
    return backend_name(CLIENT_IP, "reviews")


def spread(n: int) -> Counter[str]:
    return Counter(call()[1] for _ in range(n))


def host_lines(client, cluster: str) -> dict[str, dict[str, str]]:
    """Per host ``ip:port``, the ``key::value`` attributes Envoy's /clusters lists for it."""
    status, body = client.admin("/clusters")
    assert status == 200
    out: dict[str, dict[str, str]] = {}
    for line in body.decode().splitlines():
        parts = line.split("::")
        if len(parts) >= 4 and parts[0] == cluster and parts[1][:1].isdigit():
            out.setdefault(parts[1], {})[parts[2]] = "::".join(parts[3:])
    return out


OUTLIER = {"consecutive5xxErrors": 3, "interval": "1s", "baseEjectionTime": "60s", "maxEjectionPercent": 100}


def test_outlier_detection_ejects_the_failing_endpoint(mesh):
    # Both endpoints in one locality, so only outlier detection decides where traffic goes.
    client, _near, far = start(
        mesh, {"outlierDetection": OUTLIER, "loadBalancer": {"localityLbSetting": {"enabled": False}}}
    )
    assert set(spread(20)) == {"reviews-near", "reviews-far"}, "both serve while healthy"
    far.status = 503
    failures = 0
    for _ in range(40):
        status, _ = call()
        failures += status == 503
        if (
            host_lines(client, CLUSTER).get(f"{FAR_IP}:9080", {}).get("health_flags")
            == "/failed_outlier_check"
        ):
            break
    hosts = host_lines(client, CLUSTER)
    assert hosts[f"{FAR_IP}:9080"]["health_flags"] == "/failed_outlier_check", hosts
    assert hosts[f"{NEAR_IP}:9080"]["health_flags"] == "healthy"
    assert failures == 3, f"ejected at the consecutive-5xx threshold (3), saw {failures} failures"
    assert spread(30) == Counter({"reviews-near": 30}), "the ejected endpoint gets nothing"
    assert client.rejected_updates() == {}


def test_locality_failover_keeps_traffic_near_until_it_fails(mesh):
    client, near, _far = start(mesh, {"outlierDetection": OUTLIER})
    hosts = host_lines(client, CLUSTER)
    assert hosts[f"{NEAR_IP}:9080"]["priority"] == "0", "same region and zone as the caller"
    assert hosts[f"{FAR_IP}:9080"]["priority"] == "1", "another region: next priority"
    assert spread(30) == Counter({"reviews-near": 30}), "all traffic stays in the caller's locality"
    near.status = 503

    def near_ejected() -> bool:
        call()  # each failing call counts towards the consecutive-5xx threshold
        return host_lines(client, CLUSTER)[f"{NEAR_IP}:9080"]["health_flags"] == "/failed_outlier_check"

    eventually(near_ejected, timeout=20, what="the near endpoint ejected")
    assert spread(30) == Counter({"reviews-far": 30}), "traffic fails over to the other locality"
    assert client.rejected_updates() == {}


def test_distribute_splits_traffic_by_locality_weights(mesh):
    weights = {"region1/zone1/*": 70, "region2/zone2/*": 30}
    client, _near, _far = start(
        mesh,
        {
            "loadBalancer": {
                "simple": "ROUND_ROBIN",
                "localityLbSetting": {"distribute": [{"from": "region1/*", "to": weights}]},
            }
        },
    )
    counts = spread(300)
    assert set(counts) == {"reviews-near", "reviews-far"}, counts
    share = counts["reviews-near"] / 300
    # 70% expected; a binomial spread over 300 calls stays well within ±10 points.
    assert 0.6 <= share <= 0.8, counts
    assert client.rejected_updates() == {}


def test_connection_pool_overflow_is_rejected_by_the_circuit_breaker(mesh):
    pool = {
        "tcp": {"maxConnections": 1},
        "http": {"http1MaxPendingRequests": 1, "http2MaxRequests": 1, "idleTimeout": "30s"},
    }
    client, near, far = start(
        mesh, {"connectionPool": pool, "loadBalancer": {"localityLbSetting": {"enabled": False}}}
    )
    near.delay = far.delay = 1.0

    def one(_: int) -> tuple[int, str]:
        status, _, headers = http_get(CLIENT_IP, 9080, "/", {"Host": "reviews"}, timeout=10)
        return status, headers.get("x-envoy-overloaded", "")

    with ThreadPoolExecutor(max_workers=6) as pool_:
        results = list(pool_.map(one, range(6)))
    overloaded = [r for r in results if r == (503, "true")]
    served = [r for r in results if r[0] == 200]
    assert overloaded, f"some calls overflow the one-request limit: {results}"
    assert served, f"the admitted call is served: {results}"
    assert len(overloaded) + len(served) == 6, results
    stats = client.stats()
    prefix = f"cluster.{CLUSTER};."
    # Pending requests beyond http1MaxPendingRequests, active ones beyond http2MaxRequests.
    rejected = stats[prefix + "upstream_rq_pending_overflow"] + stats[prefix + "upstream_rq_active_overflow"]
    assert rejected == len(overloaded), {k: v for k, v in stats.items() if k.startswith(prefix)}
    _, body = client.admin("/clusters")
    limits = {
        line.split("::")[-2]: line.split("::")[-1]
        for line in body.decode().splitlines()
        if line.startswith(f"{CLUSTER}::default_priority::")
    }
    assert (limits["max_connections"], limits["max_pending_requests"], limits["max_requests"]) == (
        "1",
        "1",
        "1",
    )


def test_prefer_close_keeps_traffic_near_without_outlier_detection(mesh):
    """Service trafficDistribution PreferClose forces locality failover even with no outlierDetection."""
    client, _near, _far = start(mesh, {}, trafficDistribution="PreferClose")
    hosts = host_lines(client, CLUSTER)
    assert hosts[f"{NEAR_IP}:9080"]["priority"] == "0"
    assert hosts[f"{FAR_IP}:9080"]["priority"] == "1"
    assert spread(30) == Counter({"reviews-near": 30}), "all traffic stays in the caller's zone"
    assert client.rejected_updates() == {}
