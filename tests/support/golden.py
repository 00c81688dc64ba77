"""meshpilot's xDS resources for a golden case, as JSON: what tests/golden checks in and tests/reference
compares with istiod's.

A case is a directory with ``config.yaml`` (Kubernetes and Istio objects) and optionally ``mesh.yaml``
(MeshConfig). ``generate`` runs the same generators the ADS server uses for one proxy: CDS and LDS,
RDS for the names the listeners ask for, EDS for the EDS clusters.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import yaml
from google.protobuf import any_pb2, json_format
from support.model import build

from meshpilot.model.push_request import PushRequest
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.generators import GenerationContext, sidecar_generators
from meshpilot.xds.types import TypeUrl


def _as_dicts(resources: list[Any] | None) -> list[dict[str, Any]]:
    out = []
    for resource in resources or []:
        packed = any_pb2.Any.FromString(resource.payload)
        out.append(json_format.MessageToDict(packed, preserving_proto_field_name=True))
    return sorted(out, key=lambda d: d.get("name") or d.get("cluster_name") or "")


def _rds_names(listeners: list[dict[str, Any]]) -> set[str]:
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            rds = node.get("rds")
            if isinstance(rds, dict) and "route_config_name" in rds:
                found.add(rds["route_config_name"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(listeners)
    return found


def generate(case: Path, node_id: str, metadata: dict[str, Any]) -> dict[str, Any]:
    docs = list(yaml.safe_load_all((case / "config.yaml").read_text()))
    mesh_file = case / "mesh.yaml"
    model = build([d for d in docs if d], mesh_yaml=mesh_file.read_text() if mesh_file.exists() else None)
    proxy = model.proxy(node_id, metadata)
    request = PushRequest(full=True, forced=True, reasons=Counter(), push=model.push)
    # No XdsCache: the golden output is what the builders make, not what a cache holds.
    ctx = GenerationContext(proxy, model.push, model.index, request)
    generators = sidecar_generators()

    def run(type_url: TypeUrl, names: set[str] | None) -> list[dict[str, Any]]:
        watch = WatchedResource(type_url.value, frozenset(names or ()), wildcard=names is None)
        return _as_dicts(generators[type_url].generate(ctx, watch, None))

    clusters = run(TypeUrl.CLUSTER, None)
    listeners = run(TypeUrl.LISTENER, None)
    eds_names = {c["name"] for c in clusters if c.get("type") == "EDS"}
    return {
        "clusters": clusters,
        "listeners": listeners,
        "routes": run(TypeUrl.ROUTE, _rds_names(listeners)),
        "endpoints": run(TypeUrl.ENDPOINT, eds_names),
    }
