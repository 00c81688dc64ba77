"""``meshpilot kube-inject``: injection into manifests, as ``istioctl kube-inject`` does it offline."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import yaml

from meshpilot.webhooks.inject.config import InjectConfig, InjectionError
from meshpilot.webhooks.inject.context import Workload
from meshpilot.webhooks.inject.inject import inject_pod

# Where each workload kind keeps its pod template.
TEMPLATE_PATHS: dict[str, tuple[str, ...]] = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "ReplicationController": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}


def _inject_pod_of(obj: dict[str, Any], config: InjectConfig, warn: Callable[[str], None]) -> dict[str, Any]:
    kind = obj.get("kind")
    metadata = obj.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise InjectionError(f"{kind}: metadata is not a mapping")
    name = str(metadata.get("name") or "")
    namespace = str(metadata.get("namespace") or "default")
    workload = Workload(name, namespace, str(obj.get("apiVersion") or ""), str(kind))
    if kind == "Pod":
        # A bare pod's workload comes from its controller owner, as the webhook infers it.
        injected = inject_pod(obj, namespace, config)
        if injected is None:
            warn(f'===> Skipping injection because Pod "{name}" has sidecar injection disabled')
            return obj
        return injected
    path = TEMPLATE_PATHS[str(kind)]
    parent: Any = obj
    for key in path[:-1]:
        parent = parent.get(key) if isinstance(parent, dict) else None
    template = parent.get(path[-1]) if isinstance(parent, dict) else None
    if not isinstance(template, dict):
        raise InjectionError(f"{kind} {name!r} has no pod template at {'.'.join(path)}")
    injected = inject_pod(template, namespace, config, workload)
    if injected is None:
        warn(f'===> Skipping injection because {kind} "{name}" has sidecar injection disabled')
        return obj
    out = dict(obj)
    node = out
    for key in path[:-1]:
        node[key] = dict(node[key])
        node = node[key]
    node[path[-1]] = injected
    return out


def inject_object(obj: Any, config: InjectConfig, warn: Callable[[str], None]) -> Any:
    """One manifest object, injected when it is (or holds) a pod; anything else comes back as it was."""
    if not isinstance(obj, dict):
        return obj
    kind = obj.get("kind")
    if not isinstance(kind, str):
        return obj  # not a Kubernetes object: passed through as istioctl passes unknown kinds
    if kind.endswith("List") and (kind == "List" or isinstance(obj.get("items"), list)):
        items = obj.get("items") or []
        if not isinstance(items, list):
            raise InjectionError(f"{kind}: items is not a list")
        return {**obj, "items": [inject_object(item, config, warn) for item in items]}
    if kind == "Pod" or kind in TEMPLATE_PATHS:
        return _inject_pod_of(obj, config, warn)
    return obj


def kube_inject(text: str, config: InjectConfig, warn: Callable[[str], None]) -> str:
    """Every YAML document of ``text``, injected, as a YAML stream."""
    # istioctl injects whenever a pod does not opt out: the cluster's policy is not known offline.
    config = dataclasses.replace(config, policy="enabled")
    try:
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError as err:
        raise InjectionError(f"input is not valid YAML: {err}") from None
    out = [inject_object(doc, config, warn) for doc in documents if doc is not None]
    return yaml.safe_dump_all(out, sort_keys=True, default_flow_style=False)
