"""A small mesh the builder tests share: reviews (two versions), ratings, a TCP database, a ServiceEntry."""

from __future__ import annotations

from typing import Any

from support.kube import istio, service, workload

CLIENT = "sidecar~10.1.0.11~productpage-v1.default~default.svc.cluster.local"


def mesh_objects() -> list[dict[str, Any]]:
    return [
        *workload("productpage", "default", "10.96.0.10", 9080, {"productpage-v1": "10.1.0.11"}),
        *workload(
            "reviews",
            "default",
            "10.96.0.20",
            9080,
            {"reviews-v1": "10.1.0.21", "reviews-v2": "10.1.0.22"},
            versions={"reviews-v1": "v1", "reviews-v2": "v2"},
        ),
        *workload("ratings", "other", "10.96.0.30", 9080, {"ratings-v1": "10.1.0.31"}),
        *workload("db", "default", "10.96.0.40", 3306, {"db-0": "10.1.0.41"}, port_name="tcp"),
        *workload("cache", "default", "10.96.0.50", 6000, {"cache-0": "10.1.0.51"}, port_name="cache"),
        service("headless", "default", "None", [("tcp", 5000)], {"app": "headless"}),
        istio(
            "ServiceEntry",
            "external",
            "default",
            {
                "hosts": ["api.example.com"],
                "location": "MESH_EXTERNAL",
                "resolution": "DNS",
                "ports": [{"number": 443, "name": "https", "protocol": "HTTPS"}],
            },
        ),
        istio(
            "DestinationRule",
            "reviews",
            "default",
            {
                "host": "reviews",
                "trafficPolicy": {"loadBalancer": {"simple": "ROUND_ROBIN"}},
                "subsets": [
                    {"name": "v1", "labels": {"version": "v1"}},
                    {"name": "v2", "labels": {"version": "v2"}},
                ],
            },
        ),
    ]
