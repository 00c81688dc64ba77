"""Two server processes given the same config serve the same bytes, resource versions included.

Replicas behind the ``istiod`` Service, a server and its restart, and (later) push workers must agree
byte for byte: a delta proxy that reconnects elsewhere tells the new server the versions it holds
and is sent only what differs. Protobuf writes map fields (a Struct's fields, as in the
metadata-exchange and stats filter configs) in an order that differs between processes unless
asked to be deterministic, which this caught once.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from support.ads_client import DeltaClient
from support.golden import agent_metadata
from support.processes import Meshpilot
from support.reference import ROOT

pytestmark = [pytest.mark.integration]

CASE = ROOT / "tests" / "golden" / "cases" / "telemetry-api"
TYPES = [
    "type.googleapis.com/envoy.config.cluster.v3.Cluster",
    "type.googleapis.com/envoy.config.listener.v3.Listener",
]


async def _served(server: Meshpilot, node_id: str, metadata: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every cluster and listener, by name: (version, bytes)."""
    client = DeltaClient(f"127.0.0.1:{server.grpc_port}")
    out: dict[str, dict[str, Any]] = {}
    try:
        for type_url in TYPES:
            client.send(type_url, node_id=node_id, node_metadata=metadata)
            response = await client.recv(10)
            client.send(type_url, nonce=response.nonce)
            out[type_url] = {r.name: (r.version, r.resource.value) for r in response.resources}
    finally:
        await client.close()
    return out


async def test_two_processes_serve_identical_bytes(tmp_path: Path) -> None:
    import yaml

    proxies = yaml.safe_load((CASE / "proxies.yaml").read_text())
    config = tmp_path / "config"
    config.mkdir()
    shutil.copy(CASE / "config.yaml", config / "config.yaml")
    servers = [
        Meshpilot(tmp_path / f"s{i}", config, mesh_config=CASE / "mesh.yaml", env={"PYTHONHASHSEED": str(i)})
        for i in (1, 2)
    ]
    try:
        for server in servers:
            server.start()
        for server in servers:
            server.wait_ready()
        for name, spec in proxies.items():
            metadata = agent_metadata(spec["id"], spec.get("metadata") or {})
            first, second = [await _served(server, spec["id"], metadata) for server in servers]
            for type_url in TYPES:
                assert first[type_url], f"{name}: nothing served for {type_url}"
                assert first[type_url].keys() == second[type_url].keys()
                differ = [n for n in first[type_url] if first[type_url][n] != second[type_url][n]]
                assert not differ, f"{name}: {type_url} differs between two processes: {differ}"
    finally:
        for server in servers:
            server.stop()
