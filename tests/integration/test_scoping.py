"""A Sidecar's egress hosts limit what its proxy gets, and changes outside the scope do not push to it."""

from __future__ import annotations

import pytest
from support.kube import istio, workload
from support.wait import eventually

pytestmark = [pytest.mark.envoy, pytest.mark.integration]


def nonces(mp, proxy_id: str) -> dict[str, str]:
    [status] = [s for s in mp.get_json("/debug/syncz") if s["proxy"] == proxy_id]
    return {k: v for k, v in status.items() if k.endswith("_sent")}


def test_egress_scope_limits_clusters_and_pushes(mesh):
    mesh.write(
        "apps.yaml",
        [
            *workload("frontend", "default", "10.96.0.10", 9080, {"frontend-v1": "127.0.0.11"}),
            *workload("reviews", "default", "10.96.0.20", 9080, {"reviews-v1": "127.0.0.21"}),
            *workload("billing", "payments", "10.96.0.50", 9080, {"billing-v1": "127.0.0.51"}),
        ],
    )
    mesh.write(
        "sidecars.yaml",
        [
            istio(
                "Sidecar",
                "frontend",
                "default",
                {
                    "workloadSelector": {"labels": {"app": "frontend"}},
                    "egress": [{"bind": "127.0.0.11", "hosts": ["./*"]}],
                },
            ),
            istio(
                "Sidecar",
                "wide",
                "default",
                {
                    "workloadSelector": {"labels": {"app": "reviews"}},
                    "egress": [{"bind": "127.0.0.21", "hosts": ["*/*"]}],
                },
            ),
        ],
    )
    mp = mesh.start_meshpilot()
    scoped = mesh.sidecar("frontend-v1", "127.0.0.11", labels={"app": "frontend"}, service_account="frontend")
    wide = mesh.sidecar("reviews-v1", "127.0.0.21", labels={"app": "reviews"}, service_account="reviews")
    billing = "outbound|9080||billing.payments.svc.cluster.local"
    assert billing not in scoped.dynamic_clusters()
    assert "outbound|9080||reviews.default.svc.cluster.local" in scoped.dynamic_clusters()
    assert billing in wide.dynamic_clusters()

    before_scoped = nonces(mp, "frontend-v1.default")
    before_wide = nonces(mp, "reviews-v1.default")
    # A new billing endpoint and a billing DestinationRule: both outside frontend's scope.
    mesh.write(
        "billing-more.yaml",
        [
            istio(
                "DestinationRule",
                "billing",
                "payments",
                {"host": "billing", "subsets": [{"name": "v1", "labels": {"app": "billing"}}]},
            )
        ],
    )
    mesh.write(
        "apps.yaml",
        [
            *workload("frontend", "default", "10.96.0.10", 9080, {"frontend-v1": "127.0.0.11"}),
            *workload("reviews", "default", "10.96.0.20", 9080, {"reviews-v1": "127.0.0.21"}),
            *workload(
                "billing",
                "payments",
                "10.96.0.50",
                9080,
                {"billing-v1": "127.0.0.51", "billing-v2": "127.0.0.52"},
            ),
        ],
    )
    eventually(
        lambda: "outbound|9080|v1|billing.payments.svc.cluster.local" in wide.dynamic_clusters(),
        timeout=10,
        what="the wide proxy gets the billing subset",
    )
    eventually(
        lambda: nonces(mp, "reviews-v1.default")["endpoint_sent"] != before_wide["endpoint_sent"],
        timeout=10,
        what="EDS pushed to the wide proxy",
    )
    assert nonces(mp, "frontend-v1.default") == before_scoped, "nothing was pushed to the scoped proxy"

    # A change inside the scope does reach it.
    mesh.write(
        "frontend-vs.yaml",
        [
            istio(
                "VirtualService",
                "reviews",
                "default",
                {
                    "hosts": ["reviews"],
                    "http": [{"route": [{"destination": {"host": "reviews"}}], "timeout": "3s"}],
                },
            )
        ],
    )
    eventually(
        lambda: nonces(mp, "frontend-v1.default")["route_sent"] != before_scoped["route_sent"],
        timeout=10,
        what="RDS pushed to the scoped proxy",
    )
    assert scoped.rejected_updates() == {} and wide.rejected_updates() == {}
