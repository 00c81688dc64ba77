"""What injection templates see as ``.``: istiod's ``SidecarTemplateData``, with Kubernetes objects
and mesh protos behind Go's capitalised field names.

This module is the one place where Go names meet JSON names: ``.Spec.ServiceAccountName`` reads
``spec.serviceAccountName``, ``.TypeMeta.APIVersion`` reads ``apiVersion``, ``.ObjectMeta.Annotations``
is a ``map[string]string`` (a missing key reads ``""``), ``.ProxyConfig.InterceptionMode`` is an enum
that prints its name, and ``.ProxyConfig.GetTracing.GetTlsSettings`` is nil-safe as proto getters are.
A field the JSON leaves out reads as Go's zero value where this module knows the field's type."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from meshpilot.webhooks.inject.context import TemplateContext
from meshpilot.webhooks.inject.gotemplate import StrMap
from meshpilot.webhooks.inject.gotemplate.encode import StructDict

# Kubernetes fields whose Go type is map[string]string.
_STRING_MAPS = frozenset({"labels", "annotations", "nodeSelector", "proxyMetadata", "matchLabels"})
# Zero values of Kubernetes fields the templates read when the pod leaves them out.
_K8S_ZEROS: dict[str, Any] = {
    "name": "",
    "namespace": "",
    "generateName": "",
    "serviceAccountName": "",
    "image": "",
    "imagePullPolicy": "",
    "protocol": "",
    "containerPort": 0,
    "hostNetwork": False,
    "containers": [],
    "initContainers": [],
    "volumes": [],
    "ports": [],
    "env": [],
    "volumeMounts": [],
    "imagePullSecrets": [],
    "args": [],
    "command": [],
    "apiVersion": "",
    "kind": "",
    "priorityClassName": "",
    "restartPolicy": "",
}
# ProxyConfig and MeshConfig: enum fields (with their zero name), wrapper fields, message fields.
_ENUMS = {"interceptionMode": "REDIRECT", "controlPlaneAuthPolicy": "NONE"}
_WRAPPERS = frozenset({"holdApplicationUntilProxyStarts", "concurrency", "enablePrometheusMerge"})
_MESSAGES = frozenset(
    {"tracing", "tlsSettings", "zipkin", "datadog", "stackdriver", "lightstep", "openCensusAgent",
     "envoyMetricsService", "envoyAccessLogService", "proxyStatsMatcher", "proxyHeaders", "defaultConfig",
     "meshMTLS", "outboundTrafficPolicy", "inboundTrafficPolicy", "localityLbSetting", "drainDuration",
     "terminationDrainDuration", "privateKeyProvider", "readinessProbe", "image"}
)  # fmt: skip
PROXY_CONFIG_TYPE = "v1alpha1.ProxyConfig"
# istiod's mesh defaults (mesh.DefaultMeshConfig) for the fields templates read.
MESH_DEFAULTS: dict[str, Any] = {
    "proxyListenPort": 15001,
    "proxyInboundListenPort": 15006,
    "trustDomain": "cluster.local",
    "enablePrometheusMerge": True,
}


def json_name(go_name: str) -> str:
    """A Go field name as Kubernetes and protobuf name it in JSON: the leading capital or acronym in
    lower case (``ServiceAccountName`` → ``serviceAccountName``, ``APIVersion`` → ``apiVersion``)."""
    run = len(go_name) - len(go_name.lstrip("ABCDEFGHIJKLMNOPQRSTUVWXYZ"))
    if run == len(go_name):
        return go_name.lower()
    if run > 1:
        return go_name[: run - 1].lower() + go_name[run - 1 :]
    return go_name[:1].lower() + go_name[1:]


class KubeObject:
    """A Kubernetes struct (ObjectMeta, PodSpec, Container, …) backed by its JSON."""

    def __init__(self, data: Mapping[str, Any], type_name: str) -> None:
        self.data = data
        self.type_name = type_name

    def go_type(self) -> str:
        return self.type_name

    def go_field(self, name: str) -> Any:
        key = json_name(name)
        if key in self.data:
            return _kube_value(key, self.data[key])
        return _kube_value(key, _K8S_ZEROS.get(key))

    def go_method(self, name: str) -> Callable[..., Any] | None:
        if name.startswith("Get") and len(name) > 3:
            return lambda: self.go_field(name[3:])
        return None

    def to_plain(self) -> Any:
        return self.data


def _kube_value(key: str, value: Any) -> Any:
    if key in _STRING_MAPS:
        return StrMap({str(k): str(v) for k, v in (value or {}).items()})
    if isinstance(value, Mapping):
        return KubeObject(value, key)
    if isinstance(value, list):
        return [KubeObject(v, key) if isinstance(v, Mapping) else v for v in value]
    return value


class GoEnum:
    """A proto enum: compares and prints as its name, and has ``String``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def go_type(self) -> str:
        return "enum"

    def go_field(self, name: str) -> Any:
        raise KeyError(name)

    def go_method(self, name: str) -> Callable[..., Any] | None:
        return (lambda: self.name) if name == "String" else None

    def to_plain(self) -> Any:
        return self.name


class Wrapper:
    """A protobuf wrapper (``*wrapperspb.BoolValue``…): ``.Value``/``.GetValue``, nil-safe."""

    def __init__(self, value: Any, zero: Any) -> None:
        self.value = value
        self.zero = zero

    def go_type(self) -> str:
        return "*wrapperspb.Value"

    def go_field(self, name: str) -> Any:
        if name != "Value":
            raise KeyError(name)
        return self.zero if self.value is None else self.value

    def go_method(self, name: str) -> Callable[..., Any] | None:
        return (lambda: self.go_field("Value")) if name == "GetValue" else None

    def to_plain(self) -> Any:
        return self.value


class ProtoMessage:
    """A mesh proto message (ProxyConfig, MeshConfig, …) from its protojson form; ``data`` None is a
    nil pointer, whose getters return zero values as Go's generated getters do."""

    def __init__(
        self, data: Mapping[str, Any] | None, type_name: str, defaults: Mapping[str, Any] | None = None
    ):
        self.data = data
        self.type_name = type_name
        self.defaults = defaults or {}

    def go_type(self) -> str:
        return "*" + self.type_name

    def _get(self, key: str) -> Any:
        value = (self.data or {}).get(key, self.defaults.get(key))
        if key in _ENUMS:
            return GoEnum(str(value) if value is not None else _ENUMS[key])
        if key in _WRAPPERS:
            return Wrapper(value, False if key != "concurrency" else 0)
        if key in _STRING_MAPS:
            return StrMap({str(k): str(v) for k, v in (value or {}).items()})
        if key in _MESSAGES or isinstance(value, Mapping):
            return ProtoMessage(value if isinstance(value, Mapping) else None, key)
        if isinstance(value, list):
            return [ProtoMessage(v, key) if isinstance(v, Mapping) else v for v in value]
        return "" if value is None else value

    def go_field(self, name: str) -> Any:
        if self.data is None:
            raise KeyError(name)
        return self._get(json_name(name))

    def go_method(self, name: str) -> Callable[..., Any] | None:
        if name.startswith("Get") and len(name) > 3:
            return lambda: self._get(json_name(name[3:]))
        return None

    def to_plain(self) -> Any:
        return StructDict(self.data or {})

    def __bool__(self) -> bool:
        return self.data is not None


class Struct:
    """A Go struct with fixed fields (``SidecarTemplateData``, ``TypeMeta``, ``NamespacedName``)."""

    def __init__(self, type_name: str, fields: Mapping[str, Any]) -> None:
        self.type_name = type_name
        self.fields = dict(fields)

    def go_type(self) -> str:
        return self.type_name

    def go_field(self, name: str) -> Any:
        return self.fields[name]

    def go_method(self, name: str) -> Callable[..., Any] | None:
        return None

    def to_plain(self) -> Any:
        return StructDict((json_name(k), v) for k, v in self.fields.items())


def template_data(ctx: TemplateContext, proxy_image: str, proxy_init_image: str) -> Struct:
    """istiod's SidecarTemplateData for this pod (webhook injection, native sidecars off)."""
    metadata = ctx.pod.get("metadata") or {}
    mesh = dict(MESH_DEFAULTS)
    mesh.update(ctx.values.get("meshConfig") or {})
    workload = ctx.workload
    return Struct(
        "inject.SidecarTemplateData",
        {
            "TypeMeta": Struct("v1.TypeMeta", {"Kind": workload.kind, "APIVersion": workload.api_version}),
            "DeploymentMeta": Struct(
                "types.NamespacedName", {"Name": workload.name, "Namespace": workload.namespace}
            ),
            "ObjectMeta": KubeObject(metadata, "v1.ObjectMeta"),
            "Spec": KubeObject(ctx.pod.get("spec") or {}, "v1.PodSpec"),
            "ProxyConfig": ProtoMessage(ctx.proxy_config, PROXY_CONFIG_TYPE),
            "MeshConfig": ProtoMessage(mesh, "v1alpha1.MeshConfig"),
            "Values": ctx.values,
            "Revision": ctx.revision,
            "NativeSidecars": False,
            "ProxyImage": proxy_image,
            "ProxyInitImage": proxy_init_image,
            "ProxyUID": 1337,
            "ProxyGID": 1337,
            "InboundTrafficPolicyMode": _inbound_policy_mode(mesh),
            "CompliancePolicy": "",
        },
    )


def _inbound_policy_mode(mesh: Mapping[str, Any]) -> str:
    """istiod's InboundTrafficPolicyMode: ``localhost`` when the mesh says so, else ``passthrough``."""
    policy = mesh.get("inboundTrafficPolicy")
    mode = policy.get("mode") if isinstance(policy, Mapping) else None
    return "localhost" if mode == "LOCALHOST" else "passthrough"
