"""Every golden case's resources are the same bytes over state-of-the-world and delta ADS.

A server serves the case's files; for each of its proxies, one SotW client
and one delta client ask as Envoy asks (CDS and LDS whole, then the routes
the listeners name and the endpoints of the EDS clusters; a proxyless gRPC
client its listeners first) and every resource must match byte for byte.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from google.protobuf import json_format
from support.ads_client import AdsClient, DeltaClient
from support.golden import agent_metadata, rds_names, route_clusters
from support.kube import istio, write
from support.xds_server import running, settings_for

from meshpilot.xds.types import TypeUrl

CASES = Path(__file__).parent / "cases"


def _cases() -> list[Any]:
    return [pytest.param(case, id=case.name) for case in sorted(p for p in CASES.iterdir() if p.is_dir())]


class _Sotw:
    def __init__(self, target: str, node_id: str, metadata: dict[str, Any]) -> None:
        self.client = AdsClient(target)
        self.node = (node_id, metadata)

    async def __call__(self, type_url: str, names: Iterable[str] | None) -> dict[str, bytes]:
        wanted = sorted(names) if names is not None else []
        # The node on every request: the server reads it from the first and ignores it after.
        self.client.send(type_url, wanted, node_id=self.node[0], node_metadata=self.node[1])
        response = await self.client.recv()
        self.client.ack(response, wanted)
        return {_name(type_url, r.value): r.value for r in response.resources}


class _Delta:
    def __init__(self, target: str, node_id: str, metadata: dict[str, Any]) -> None:
        self.client = DeltaClient(target)
        self.node = (node_id, metadata)

    async def __call__(self, type_url: str, names: Iterable[str] | None) -> dict[str, bytes]:
        wanted = sorted(names) if names is not None else []
        self.client.send(type_url, wanted, node_id=self.node[0], node_metadata=self.node[1])
        response = await self.client.recv()
        self.client.ack(response)
        return {r.name: r.resource.value for r in response.resources}


def _name(type_url: str, value: bytes) -> str:
    message: Any = {
        TypeUrl.CLUSTER: cluster_pb2.Cluster,
        TypeUrl.LISTENER: listener_pb2.Listener,
        TypeUrl.ROUTE: route_pb2.RouteConfiguration,
    }.get(TypeUrl(type_url))
    if message is None:
        from envoy.config.endpoint.v3 import endpoint_pb2

        return str(endpoint_pb2.ClusterLoadAssignment.FromString(value).cluster_name)
    return str(message.FromString(value).name)


def _dicts(resources: dict[str, bytes], message: Any) -> list[dict[str, Any]]:
    return [
        json_format.MessageToDict(message.FromString(v), preserving_proto_field_name=True)
        for v in resources.values()
    ]


async def _ask(ask: Any, spec: dict[str, Any]) -> dict[str, dict[str, bytes]]:
    """As Envoy (or a proxyless client, when the proxy names its listeners) asks; a type with no names
    to ask for is not asked (an empty name list unsubscribes)."""
    out: dict[str, dict[str, bytes]] = {}

    async def named(short: str, type_url: TypeUrl, names: Iterable[str]) -> None:
        wanted = sorted(names)
        if wanted:
            out[short] = await ask(type_url, wanted)

    listeners = spec.get("listeners")
    if listeners:
        await named("lds", TypeUrl.LISTENER, listeners)
        await named("rds", TypeUrl.ROUTE, rds_names(_dicts(out.get("lds", {}), listener_pb2.Listener)))
        routes = _dicts(out.get("rds", {}), route_pb2.RouteConfiguration)
        await named("cds", TypeUrl.CLUSTER, route_clusters(routes))
    else:
        out["cds"] = await ask(TypeUrl.CLUSTER, None)
        out["lds"] = await ask(TypeUrl.LISTENER, None)
        await named("rds", TypeUrl.ROUTE, rds_names(_dicts(out["lds"], listener_pb2.Listener)))
    clusters = {name: cluster_pb2.Cluster.FromString(value) for name, value in out.get("cds", {}).items()}
    await named(
        "eds", TypeUrl.ENDPOINT, [n for n, c in clusters.items() if c.type == cluster_pb2.Cluster.EDS]
    )
    return out


@pytest.mark.parametrize("case", _cases())
async def test_sotw_and_delta_send_the_same_resources(
    case: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UNSAFE_PILOT_ENABLE_RUNTIME_ASSERTIONS", "true")
    config = tmp_path / "config"
    config.mkdir()
    shutil.copy(case / "config.yaml", config / "config.yaml")
    mesh = case / "mesh.yaml"
    proxies: dict[str, Any] = yaml.safe_load((case / "proxies.yaml").read_text())
    async with running(settings_for(config, mesh_config=mesh if mesh.exists() else None)) as app:
        target = str(app.settings.grpc_addr)
        nodes = {
            name: agent_metadata(spec["id"], spec.get("metadata") or {}) for name, spec in proxies.items()
        }
        over_sotw: dict[str, dict[str, dict[str, bytes]]] = {}
        for name, spec in proxies.items():
            sotw = _Sotw(target, spec["id"], nodes[name])
            try:
                over_sotw[name] = await _ask(sotw, spec)
            finally:
                await sotw.client.close()
        # A new snapshot that changes nothing the case's proxies see (a policy of another namespace): the
        # delta clients are then served from the XdsCache, not the snapshot's memo, and every hit is
        # built again and compared (UNSAFE_PILOT_ENABLE_RUNTIME_ASSERTIONS above).
        first = app.server.push_context
        write(
            config / "unrelated.yaml",
            [
                istio(
                    "PeerAuthentication",
                    "strict",
                    "unrelated",
                    {"mtls": {"mode": "STRICT"}},
                    group="security",
                )
            ],
        )
        for _ in range(250):
            if app.server.push_context is not first:
                break
            await asyncio.sleep(0.02)
        assert app.server.push_context is not first, "no new snapshot"
        for name, spec in proxies.items():
            delta = _Delta(target, spec["id"], nodes[name])
            try:
                over_delta = await _ask(delta, spec)
            finally:
                await delta.client.close()
            assert over_sotw[name].keys() == over_delta.keys(), name
            assert any(over_delta.values()), f"{name}: nothing at all: the comparison would show nothing"
            for short, resources in over_sotw[name].items():
                assert resources == over_delta[short], f"{name}: {short} differ between the protocols"
        registry = app.metrics.registry
        if any(not spec.get("listeners") for spec in proxies.values()):  # proxyless gRPC is not cached
            assert (registry.get_sample_value("xds_cache_reads_total", {"type": "hit"}) or 0) > 0, "verified"
        mismatches = [
            sample
            for metric in registry.collect()
            if metric.name == "meshpilot_xds_cache_mismatches"
            for sample in metric.samples
            if sample.value
        ]
        assert not mismatches, f"cache keys that miss an input: {mismatches}"
