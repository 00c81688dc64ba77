"""Clusters of ServiceEntries by resolution and location, as istiod's cluster_builder shapes them."""

from __future__ import annotations

from typing import Any

from envoy.config.cluster.v3 import cluster_pb2
from google.protobuf import json_format
from support.kube import istio
from support.mesh_objects import CLIENT
from support.model import build

from meshpilot.networking.cluster import ClusterInputs, build_clusters

CLIENT_POD = istio("WorkloadEntry", "client", "default", {"address": "10.1.0.11"})


def entry(name: str, resolution: str, location: str = "MESH_INTERNAL", **spec: Any) -> dict[str, Any]:
    body = {
        "hosts": [f"{name}.example.com"],
        "location": location,
        "resolution": resolution,
        "ports": [{"number": 7000, "name": "tcp", "protocol": "TCP", "targetPort": 7100}],
        **spec,
    }
    return istio("ServiceEntry", name, "default", body)


def clusters(*docs: dict[str, Any]) -> dict[str, Any]:
    model = build([CLIENT_POD, *docs])
    proxy = model.proxy(CLIENT)
    return {c.name: c for c in build_clusters(ClusterInputs(proxy, model.push, model.index))}


def hosts(cluster: Any) -> list[tuple[str, int]]:
    return [
        (e.endpoint.address.socket_address.address, e.endpoint.address.socket_address.port_value)
        for group in cluster.load_assignment.endpoints
        for e in group.lb_endpoints
    ]


def test_each_resolution_gets_its_cluster_type() -> None:
    found = clusters(
        entry("static", "STATIC", endpoints=[{"address": "10.9.0.1"}, {"address": "10.9.0.2"}]),
        entry("dns", "DNS", endpoints=[{"address": "a.backend.test"}, {"address": "10.9.0.3"}]),
        entry("dnsrr", "DNS_ROUND_ROBIN", endpoints=[{"address": "b.backend.test"}]),
        entry("none", "NONE", addresses=["10.8.0.0/16"]),
    )
    static = found["outbound|7000||static.example.com"]
    assert static.type == cluster_pb2.Cluster.EDS
    dns = found["outbound|7000||dns.example.com"]
    assert dns.type == cluster_pb2.Cluster.STRICT_DNS
    assert hosts(dns) == [("a.backend.test", 7100), ("10.9.0.3", 7100)]
    assert dns.dns_lookup_family == cluster_pb2.Cluster.V4_ONLY
    rr = found["outbound|7000||dnsrr.example.com"]
    assert rr.type == cluster_pb2.Cluster.LOGICAL_DNS
    assert hosts(rr) == [("b.backend.test", 7100)]
    none = found["outbound|7000||none.example.com"]
    assert none.type == cluster_pb2.Cluster.ORIGINAL_DST
    # Resolution NONE sends to the targetPort instead of the port called.
    assert none.original_dst_lb_config.upstream_port_override.value == 7100


def test_only_resolution_none_overrides_the_original_destination_port() -> None:
    passthrough_lb = istio(
        "DestinationRule",
        "static",
        "default",
        {"host": "static.example.com", "trafficPolicy": {"loadBalancer": {"simple": "PASSTHROUGH"}}},
    )
    found = clusters(entry("static", "STATIC", endpoints=[{"address": "10.9.0.1"}]), passthrough_lb)
    cluster = found["outbound|7000||static.example.com"]
    assert cluster.type == cluster_pb2.Cluster.ORIGINAL_DST
    assert not cluster.original_dst_lb_config.HasField("upstream_port_override")


def test_mesh_external_gets_no_auto_mtls() -> None:
    endpoints = [{"address": "10.9.0.1", "serviceAccount": "backend"}]
    found = clusters(
        entry("outside", "STATIC", "MESH_EXTERNAL", endpoints=endpoints),
        entry("inside", "STATIC", "MESH_INTERNAL", endpoints=endpoints),
    )
    outside = found["outbound|7000||outside.example.com"]
    assert not outside.transport_socket_matches and not outside.HasField("transport_socket")
    istio_meta = json_format.MessageToDict(outside.metadata.filter_metadata["istio"])
    # External, and still named for telemetry, as istiod's cluster builder writes it.
    assert istio_meta == {
        "external": True,
        "services": [{"host": "outside.example.com", "name": "outside.example.com", "namespace": "default"}],
    }
    inside = found["outbound|7000||inside.example.com"]
    assert [m.name for m in inside.transport_socket_matches] == ["tlsMode-istio", "tlsMode-disabled"]
