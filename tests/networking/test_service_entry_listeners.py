"""Outbound listeners of ServiceEntries without addresses, as istiod builds them."""

from __future__ import annotations

from typing import Any

from envoy.config.listener.v3 import listener_pb2
from support.kube import istio
from support.mesh_objects import CLIENT
from support.model import build

from meshpilot.model.push_request import PushRequest
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.generators.base import GenerationContext
from meshpilot.xds.generators.lds import ListenerGenerator

LDS = "type.googleapis.com/envoy.config.listener.v3.Listener"


def listener_names(*docs: dict[str, Any]) -> set[str]:
    model = build(docs)
    proxy = model.proxy(CLIENT, {"INTERCEPTION_MODE": "REDIRECT"})
    ctx = GenerationContext(proxy, model.push, model.index, PushRequest(push=model.push))
    out = set()
    for resource in ListenerGenerator().generate(ctx, WatchedResource(LDS), None) or []:
        listener = listener_pb2.Listener()
        resource.message().Unpack(listener)
        out.add(listener.name)
    return out


def none_entry(name: str, port: int, **spec: Any) -> dict[str, Any]:
    body = {
        "hosts": [f"{name}.example.com"],
        "location": "MESH_EXTERNAL",
        "resolution": "NONE",
        "ports": [{"number": port, "name": "tcp", "protocol": "TCP"}],
        **spec,
    }
    return istio("ServiceEntry", name, "default", body)


def test_resolution_none_listens_per_endpoint_like_a_headless_service() -> None:
    names = listener_names(
        none_entry("plain", 7001),
        none_entry("pinned", 7002, workloadSelector={"labels": {"app": "pinned"}}),
        istio("WorkloadEntry", "pinned-1", "default", {"address": "10.9.0.1", "labels": {"app": "pinned"}}),
        istio("WorkloadEntry", "pinned-2", "default", {"address": "10.9.0.2", "labels": {"app": "pinned"}}),
        none_entry("selecting", 7003, workloadSelector={"labels": {"app": "nothing-yet"}}),
    )
    # No endpoints, no selector: any destination on the port.
    assert "0.0.0.0_7001" in names
    # Selected workloads: one listener per workload address, none on the wildcard.
    assert {"10.9.0.1_7002", "10.9.0.2_7002"} <= names
    assert "0.0.0.0_7002" not in names
    # A selector that selects nothing yet: no listener, as for a headless service without pods.
    assert not any(n.endswith("_7003") for n in names)
