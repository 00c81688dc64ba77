"""Kubernetes objects for test config directories, written compactly."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml


def namespace(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def service(
    name: str,
    namespace: str,
    cluster_ip: str,
    ports: Iterable[tuple[str, int]],
    selector: Mapping[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "clusterIP": cluster_ip,
        "ports": [{"name": pname, "port": port, "targetPort": port} for pname, port in ports],
        **spec,
    }
    if selector is not None:
        body["selector"] = dict(selector)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": body,
    }


def pod(
    name: str,
    namespace: str,
    ip: str,
    labels: Mapping[str, str],
    service_account: str = "default",
    node: str = "",
) -> dict[str, Any]:
    # A container needs an image for a real API server; nothing here pulls it.
    spec: dict[str, Any] = {
        "serviceAccountName": service_account,
        "containers": [{"name": "app", "image": "app:latest"}],
    }
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": spec,
        "status": {"podIP": ip, "phase": "Running"},
    }


def endpoint_slice(
    name: str,
    namespace: str,
    service_name: str,
    ports: Iterable[tuple[str, int]],
    pods: Iterable[tuple[str, str]],
) -> dict[str, Any]:
    """``pods`` are (pod name, IP) pairs."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"kubernetes.io/service-name": service_name},
        },
        "addressType": "IPv4",
        "ports": [{"name": pname, "port": port, "protocol": "TCP"} for pname, port in ports],
        "endpoints": [
            {
                "addresses": [ip],
                "conditions": {"ready": True},
                "targetRef": {"kind": "Pod", "name": pod_name, "namespace": namespace},
            }
            for pod_name, ip in pods
        ],
    }


def workload(
    service_name: str,
    namespace: str,
    cluster_ip: str,
    port: int,
    instances: Mapping[str, str],
    *,
    labels: Mapping[str, str] | None = None,
    port_name: str = "http",
    versions: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """A Service with one Pod per instance (pod name -> IP) and the EndpointSlice tying them together."""
    base = {"app": service_name, **(labels or {})}
    docs: list[dict[str, Any]] = [service(service_name, namespace, cluster_ip, [(port_name, port)], base)]
    for pod_name, ip in instances.items():
        pod_labels = dict(base)
        if versions and pod_name in versions:
            pod_labels["version"] = versions[pod_name]
        docs.append(pod(pod_name, namespace, ip, pod_labels, service_account=service_name))
    docs.append(
        endpoint_slice(
            f"{service_name}-slice", namespace, service_name, [(port_name, port)], instances.items()
        )
    )
    return docs


def istio(
    kind: str, name: str, namespace: str, spec: Mapping[str, Any], group: str = "networking"
) -> dict[str, Any]:
    return {
        "apiVersion": f"{group}.istio.io/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": dict(spec),
    }


def egress_sidecar(app: str, bind: str, namespace: str = "default") -> dict[str, Any]:
    """A Sidecar binding ``app``'s egress listeners to ``bind``: how tests send through a sidecar
    that captures nothing (requests to ``bind:PORT`` with a Host header are routed as an app's)."""
    return istio(
        "Sidecar",
        app,
        namespace,
        {"workloadSelector": {"labels": {"app": app}}, "egress": [{"bind": bind, "hosts": ["./*"]}]},
    )


def write(path: Path, docs: Iterable[Mapping[str, Any]]) -> Path:
    """Write documents as one multi-document YAML file, atomically (the watcher never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(yaml.safe_dump_all([dict(d) for d in docs], sort_keys=False))
    tmp.replace(path)
    return path
