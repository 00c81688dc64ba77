"""What a template sees: the pod, the workload that owns it, the proxy config and the values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format

from meshpilot.config.errors import ConfigError
from meshpilot.config.protojson import parse_spec
from meshpilot.input_limits import InputRejected, load_yaml
from meshpilot.model.mesh import ProxyConfig
from meshpilot.webhooks.inject.config import InjectionError

PROXY_CONFIG_ANNOTATION = "proxy.istio.io/config"


@dataclass(frozen=True)
class Workload:
    """istiod's DeploymentMeta plus TypeMeta: names the owner in ISTIO_META_OWNER and the workload name."""

    name: str
    namespace: str
    api_version: str
    kind: str


@dataclass(frozen=True)
class TemplateContext:
    pod: dict[str, Any]
    workload: Workload
    proxy_config: dict[str, Any]
    values: dict[str, Any]
    revision: str

    @property
    def annotations(self) -> dict[str, str]:
        return dict((self.pod.get("metadata") or {}).get("annotations") or {})

    @property
    def labels(self) -> dict[str, str]:
        return dict((self.pod.get("metadata") or {}).get("labels") or {})

    def annotation(self, key: str, default: Any) -> str:
        """The template's ``annotation`` helper: the pod's annotation, else the default, as text."""
        value = self.annotations.get(key)
        if value is None:
            value = default
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)


def proxy_config_overlay(pod: dict[str, Any]) -> dict[str, Any]:
    """The ``proxy.istio.io/config`` annotation (YAML or JSON) as a mapping; meshpilot's mesh defaults
    add nothing, so PROXY_CONFIG carries exactly this overlay, as istiod's does with a default mesh."""
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(PROXY_CONFIG_ANNOTATION)
    if text is None:
        return {}
    try:
        data = load_yaml(str(text), f"annotation {PROXY_CONFIG_ANNOTATION}")
    except InputRejected as err:
        raise InjectionError(str(err)) from None
    message = ProxyConfig()
    try:
        parse_spec(data, message, PROXY_CONFIG_ANNOTATION)
    except ConfigError as err:
        raise InjectionError(f"annotation {err}") from None
    # Through the proto so PROXY_CONFIG lists fields in the proto's order, as istiod's protoToJSON.
    out: dict[str, Any] = json_format.MessageToDict(message)
    if "proxyMetadata" in out:
        out["proxyMetadata"] = dict(sorted(out["proxyMetadata"].items()))
    return out


def pod_workload(pod: dict[str, Any], namespace: str) -> Workload:
    """The owning workload as istiod infers it in the webhook: a ReplicaSet named
    ``<deployment>-<pod-template-hash>`` means its Deployment; another controller owner is itself; a pod
    without one is its own workload."""
    metadata = pod.get("metadata") or {}
    labels = metadata.get("labels") or {}
    for ref in metadata.get("ownerReferences") or []:
        if not ref.get("controller"):
            continue
        name, kind = str(ref.get("name", "")), str(ref.get("kind", ""))
        api_version = str(ref.get("apiVersion", ""))
        pod_hash = labels.get("pod-template-hash")
        if kind == "ReplicaSet" and pod_hash and name.endswith("-" + pod_hash):
            return Workload(name[: -len(pod_hash) - 1], namespace, "apps/v1", "Deployment")
        return Workload(name, namespace, api_version, kind)
    name = str(metadata.get("name") or "")
    if not name and metadata.get("generateName"):
        name = str(metadata["generateName"]).rstrip("-")
    return Workload(name, namespace, "v1", "Pod")
