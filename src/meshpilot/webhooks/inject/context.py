"""What a template sees: the pod, the workload that owns it, the proxy config and the values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format

from meshpilot.config.errors import ConfigError
from meshpilot.config.protojson import parse_spec
from meshpilot.input_limits import InputRejected, load_yaml
from meshpilot.model.mesh import ProxyConfig, default_proxy_config
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
    """One pod's injection inputs; ``proxy_config`` is its effective proxy config (protojson, every set
    field: what templates read as ``.ProxyConfig``)."""

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


def _annotation_proxy_config(pod: dict[str, Any]) -> Any | None:
    """The ``proxy.istio.io/config`` annotation (YAML or JSON) as a ProxyConfig, None without one."""
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(PROXY_CONFIG_ANNOTATION)
    if text is None:
        return None
    try:
        data = load_yaml(str(text), f"annotation {PROXY_CONFIG_ANNOTATION}")
    except InputRejected as err:
        raise InjectionError(str(err)) from None
    message = ProxyConfig()
    try:
        parse_spec(data, message, PROXY_CONFIG_ANNOTATION)
    except ConfigError as err:
        raise InjectionError(f"annotation {err}") from None
    return message


# ProxyHeaders fields a layer that sets proxyHeaders but not these keeps from the layer below
# (istiod's correctProxyHeaders).
_INHERITED_HEADERS = ("request_id", "server", "attempt_count", "envoy_debug_headers")


def _layer(merged: Any, over: Any) -> None:
    """istiod's MergeProxyConfig of one layer as mergeWithPrecedence feeds it (the layer's protojson, so
    only its populated fields): each replaces the field below whole, except that proxyMetadata maps
    are united and proxyHeaders keeps the header settings the layer leaves unset."""
    below = ProxyConfig()
    below.CopyFrom(merged)
    for field, value in over.ListFields():
        if field.name == "proxy_metadata":
            merged.proxy_metadata.update(value)
            continue
        merged.ClearField(field.name)
        if field.is_repeated or field.message_type is not None:
            getattr(merged, field.name).MergeFrom(value)
        else:
            setattr(merged, field.name, value)
    if over.HasField("proxy_headers") and below.HasField("proxy_headers"):
        headers, previous = merged.proxy_headers, below.proxy_headers
        if not headers.forwarded_client_cert:
            headers.forwarded_client_cert = previous.forwarded_client_cert
        for name in _INHERITED_HEADERS:
            if not headers.HasField(name) and previous.HasField(name):
                getattr(headers, name).CopyFrom(getattr(previous, name))


def _go_json(message: Any) -> dict[str, Any]:
    """protomarshal.ToJSON's object: set fields in declaration order (not Python's field-number order),
    map keys sorted."""
    data: dict[str, Any] = json_format.MessageToDict(message)
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        key = field.camelcase_name
        if key not in data:
            continue
        value = data[key]
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value = dict(sorted(value.items()))
        elif field.message_type is not None and not field.is_repeated and isinstance(value, dict):
            value = _go_json(getattr(message, field.name))
        out[key] = value
    return out


def effective_proxy_config(pod: dict[str, Any], mesh: Any | None = None) -> dict[str, Any]:
    """The pod's proxy config as istiod's webhook computes it (EffectiveProxyConfig): the built-in
    defaults, then the mesh's ``defaultConfig``, then the ``proxy.istio.io/config`` annotation, each
    layered as mergeWithPrecedence does; as protojson, every set field included (what templates read
    as ``.ProxyConfig``). ProxyConfig resources, the layer between mesh and annotation, are a kind
    meshpilot does not read, so they add nothing here."""
    merged = ProxyConfig()
    _layer(merged, default_proxy_config())
    # Without a mesh (offline kube-inject, tests) the mesh's defaultConfig is the defaults themselves.
    if mesh is not None:
        _layer(merged, mesh.default_config)
    annotation = _annotation_proxy_config(pod)
    if annotation is not None:
        _layer(merged, annotation)
    return _go_json(merged)


# The fields istiod's cleanProxyConfig leaves out of PROXY_CONFIG when they equal the defaults.
_CLEANED = (
    "configPath",
    "binaryPath",
    "controlPlaneAuthPolicy",
    "serviceCluster",
    "drainDuration",
    "terminationDrainDuration",
    "discoveryAddress",
    "envoyMetricsService",
    "envoyAccessLogService",
    "tracing",
    "proxyAdminPort",
    "statNameLength",
    "statusPort",
    "concurrency",
)
_DEFAULTS = _go_json(default_proxy_config())


def clean_proxy_config(data: dict[str, Any]) -> dict[str, Any]:
    """A proxy config (protojson) without the fields equal to istiod's defaults, as istiod's
    protoToJSON writes PROXY_CONFIG: a default mesh gives ``{}``."""
    return {k: v for k, v in data.items() if not (k in _CLEANED and v == _DEFAULTS.get(k))}


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
