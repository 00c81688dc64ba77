"""meshpilot's xDS resources for a golden case, as JSON: what tests/golden checks in and tests/reference
compares with istiod's.

A case is a directory with ``config.yaml`` (Kubernetes and Istio objects), ``proxies.yaml`` (node IDs
with what is particular to each proxy's metadata) and optionally ``mesh.yaml`` (MeshConfig).
``agent_metadata`` completes a proxy's metadata to what Istio's own agent sends for an injected pod,
so meshpilot and istiod are judged on a real node, not a hand-made subset. ``generate`` runs the
same generators the ADS server uses for one proxy: CDS and LDS, RDS for the names the listeners ask
for, EDS for the EDS clusters.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from google.protobuf import any_pb2, json_format
from support.model import build

from meshpilot.model.push_request import PushRequest
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.generators import GenerationContext, generators_by_metadata, sidecar_generators
from meshpilot.xds.types import TypeUrl

#: The version Istio's agent reports: the reference build's stamp (ISTIO_BUILD_VERSION in the Makefile).
AGENT_ISTIO_VERSION = "1.31-dev"


def agent_metadata(node_id: str, metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The node metadata Istio's agent sends for the pod of ``node_id``, with ``metadata`` on top.

    The keys and defaults are those of a real pilot-agent run on a sidecar injected by Istio's
    template (``tests/reference/agent_node_metadata.json``, recorded by test_istio_agent.py);
    values come from the node ID (``TYPE~IP~POD.NS~NS.svc.DOMAIN``) and the pod's labels.
    """
    kind, ip, pod_ref, _ = node_id.split("~")
    pod, namespace = pod_ref.rsplit(".", 1)
    labels = dict(metadata.get("LABELS") or {})
    # A Deployment's pod is <deployment>-<replicaset hash>-<pod hash>; the cases name pods <workload>-N.
    deployment = re.fullmatch(r"(.+)-[a-z0-9]{6,10}-[a-z0-9]{5}", pod)
    workload = deployment.group(1) if deployment else pod.rsplit("-", 1)[0]
    app = labels.get("app") or labels.get("istio") or workload
    if kind == "sidecar":
        labels.setdefault("security.istio.io/tlsMode", "istio")
    labels.setdefault("service.istio.io/canonical-name", app)
    labels.setdefault("service.istio.io/canonical-revision", labels.get("version", "latest"))
    base: dict[str, Any] = {
        "ANNOTATIONS": {
            "istio.io/rev": "default",
            "kubectl.kubernetes.io/default-container": app,
            "kubectl.kubernetes.io/default-logs-container": app,
            "prometheus.io/path": "/stats/prometheus",
            "prometheus.io/port": "15020",
            "prometheus.io/scrape": "true",
        },
        "APP_CONTAINERS": app,
        "CLUSTER_ID": "Kubernetes",
        "ENVOY_PROMETHEUS_PORT": 15090,
        "ENVOY_SKIP_DEPRECATED_LOGS": "true",
        "ENVOY_STATUS_PORT": 15021,
        "INSTANCE_IPS": ip,
        "INTERCEPTION_MODE": "REDIRECT",
        "ISTIO_VERSION": AGENT_ISTIO_VERSION,
        "MESH_ID": "cluster.local",
        "METADATA_DISCOVERY": "false",
        "NAME": pod,
        "NAMESPACE": namespace,
        "OWNER": f"kubernetes://apis/apps/v1/namespaces/{namespace}/deployments/{workload}",
        "PILOT_SAN": ["istiod.istio-system.svc"],
        "PROXY_CONFIG": {
            "binaryPath": "/usr/local/bin/envoy",
            "configPath": "./etc/istio/proxy",
            "discoveryAddress": "istiod.istio-system.svc:15012",
            "drainDuration": "45s",
            "proxyAdminPort": 15000,
            "serviceCluster": "istio-proxy",
            "statNameLength": 189,
            "statusPort": 15020,
            "terminationDrainDuration": "5s",
        },
        "WORKLOAD_IDENTITY_SOCKET_FILE": "socket",
        "WORKLOAD_NAME": workload,
    }
    return {**base, **metadata, "LABELS": labels}


def _as_dicts(resources: list[Any] | None) -> list[dict[str, Any]]:
    out = []
    for resource in resources or []:
        packed = any_pb2.Any.FromString(resource.payload)
        out.append(json_format.MessageToDict(packed, preserving_proto_field_name=True))
    return sorted(out, key=lambda d: d.get("name") or d.get("cluster_name") or "")


def rds_names(listeners: list[dict[str, Any]]) -> set[str]:
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


def route_clusters(routes: list[dict[str, Any]]) -> set[str]:
    """The clusters a proxyless gRPC client asks for: every cluster its routes name."""
    found: set[str] = set()
    for config in routes:
        for vhost in config.get("virtual_hosts", []):
            for route in vhost.get("routes", []):
                action = route.get("route", {})
                if "cluster" in action:
                    found.add(action["cluster"])
                found.update(c["name"] for c in action.get("weighted_clusters", {}).get("clusters", []))
    return found


def generate(
    case: Path, node_id: str, metadata: dict[str, Any], listeners: list[str] | None = None
) -> dict[str, Any]:
    """A proxy's resources, asked for as its client asks: a sidecar takes CDS and LDS whole, then the
    routes and endpoints they name; a proxyless gRPC client (``listeners`` given) asks for those
    listeners, then the routes they name, the clusters the routes name, and their endpoints."""
    docs = list(yaml.safe_load_all((case / "config.yaml").read_text()))
    mesh_file = case / "mesh.yaml"
    model = build([d for d in docs if d], mesh_yaml=mesh_file.read_text() if mesh_file.exists() else None)
    proxy = model.proxy(node_id, agent_metadata(node_id, metadata))
    request = PushRequest(full=True, forced=True, reasons=Counter(), push=model.push)
    # No XdsCache: the golden output is what the builders make, not what a cache holds.
    ctx = GenerationContext(proxy, model.push, model.index, request)
    # As the ADS server picks them: the proxy's GENERATOR's generators first, then the defaults.
    generators = {**sidecar_generators(), **generators_by_metadata().get(proxy.metadata.generator, {})}

    def run(type_url: TypeUrl, names: set[str] | None) -> list[dict[str, Any]]:
        watch = WatchedResource(type_url.value, frozenset(names or ()), wildcard=names is None)
        return _as_dicts(generators[type_url].generate(ctx, watch, None))

    if listeners is not None:
        assert listeners, "a proxyless client names the listeners it asks for"
        found_listeners = run(TypeUrl.LISTENER, set(listeners))
        routes = run(TypeUrl.ROUTE, rds_names(found_listeners))
        clusters = run(TypeUrl.CLUSTER, route_clusters(routes))
    else:
        clusters = run(TypeUrl.CLUSTER, None)
        found_listeners = run(TypeUrl.LISTENER, None)
        routes = run(TypeUrl.ROUTE, rds_names(found_listeners))
    eds_names = {c["name"] for c in clusters if c.get("type") == "EDS"}
    return {
        "clusters": clusters,
        "listeners": found_listeners,
        "routes": routes,
        "endpoints": run(TypeUrl.ENDPOINT, eds_names),
    }
