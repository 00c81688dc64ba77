"""A REDIRECT-mode sidecar (virtualOutbound, virtualInbound, mTLS chains) gets config Envoy accepts."""

from __future__ import annotations

import pytest
from support.kube import istio, workload
from support.processes import free_port

pytestmark = [pytest.mark.envoy, pytest.mark.integration]


def test_redirect_mode_config_is_accepted(mesh, tmp_path):
    outbound, inbound = free_port(), free_port()
    mesh_config = tmp_path / "mesh.yaml"
    # The capture ports are bound for real here (no iptables), so take free ones.
    mesh_config.write_text(f"proxyListenPort: {outbound}\nproxyInboundListenPort: {inbound}\n")
    mesh.write(
        "apps.yaml",
        [
            *workload("reviews", "default", "10.96.0.20", 9080, {"reviews-v1": "127.0.0.21"}),
            *workload("db", "default", "10.96.0.40", 3306, {"db-0": "127.0.0.41"}, port_name="mysql"),
            *workload("cache", "default", "10.96.0.50", 6000, {"cache-0": "127.0.0.51"}, port_name="cache"),
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
                    "trafficPolicy": {
                        "connectionPool": {
                            "tcp": {"maxConnections": 10},
                            "http": {"http1MaxPendingRequests": 5},
                        },
                        "outlierDetection": {
                            "consecutive5xxErrors": 3,
                            "interval": "5s",
                            "baseEjectionTime": "30s",
                        },
                    },
                    "subsets": [{"name": "v1", "labels": {"version": "v1"}}],
                },
            ),
        ],
    )
    mesh.start_meshpilot(mesh_config=mesh_config)
    envoy = mesh.sidecar(
        "reviews-v1",
        "127.0.0.21",
        labels={"app": "reviews"},
        service_account="reviews",
        interception="REDIRECT",
    )
    assert envoy.rejected_updates() == {}
    dump = envoy.config_dump()
    listeners = set()
    for config in dump["configs"]:
        if config["@type"].endswith("ListenersConfigDump"):
            listeners = {
                item["name"] for item in config.get("dynamic_listeners", []) if "active_state" in item
            }
    assert {
        "virtualOutbound",
        "virtualInbound",
        "0.0.0.0_9080",
        "10.96.0.40_3306",
        "10.96.0.50_6000",
    } <= listeners
    stats = envoy.stats()
    assert stats["listener_manager.total_listeners_warming"] == 0
    assert stats["cluster_manager.warming_clusters"] == 0
