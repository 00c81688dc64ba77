"""Core Kubernetes objects, reduced to the fields the Kubernetes registry reads.

The same parsing serves files and the Kubernetes API: both hand over the
object as a JSON-like dict. Each type is plain, picklable data.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any, ClassVar

from meshpilot.config.errors import ConfigError, type_name
from meshpilot.model.kind import Kind


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    name: str
    namespace: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    resource_version: str = ""
    creation_timestamp: str = ""
    deletion_timestamp: str = ""
    uid: str = ""
    owner_references: tuple[tuple[str, str], ...] = ()  # (kind, name)


@dataclass(frozen=True, slots=True)
class KubeNamespace:
    meta: ObjectMeta
    kind: ClassVar[Kind] = Kind.NAMESPACE


@dataclass(frozen=True, slots=True)
class KubeNode:
    meta: ObjectMeta
    kind: ClassVar[Kind] = Kind.NODE


@dataclass(frozen=True, slots=True)
class ServicePortSpec:
    name: str
    port: int
    protocol: str = "TCP"
    app_protocol: str | None = None
    target_port: int | str = 0
    node_port: int = 0


@dataclass(frozen=True, slots=True)
class KubeService:
    meta: ObjectMeta
    type: str = "ClusterIP"
    cluster_ips: tuple[str, ...] = ()
    ports: tuple[ServicePortSpec, ...] = ()
    selector: dict[str, str] | None = None
    external_name: str = ""
    internal_traffic_policy: str = ""
    publish_not_ready_addresses: bool = False
    #: ``spec.trafficDistribution`` (``PreferClose``), or "".
    traffic_distribution: str = ""
    kind: ClassVar[Kind] = Kind.SERVICE

    @property
    def is_headless(self) -> bool:
        return self.cluster_ips[:1] == ("None",)


@dataclass(frozen=True, slots=True)
class EndpointPortSpec:
    name: str
    port: int
    protocol: str = "TCP"
    app_protocol: str | None = None


@dataclass(frozen=True, slots=True)
class SliceEndpoint:
    addresses: tuple[str, ...]
    #: None means "unknown", which Kubernetes says to read as true.
    ready: bool | None = None
    serving: bool | None = None
    terminating: bool | None = None
    hostname: str = ""
    node_name: str = ""
    zone: str = ""
    #: (kind, namespace, name) of the backing object, usually a Pod.
    target_ref: tuple[str, str, str] | None = None


@dataclass(frozen=True, slots=True)
class KubeEndpointSlice:
    meta: ObjectMeta
    address_type: str = "IPv4"
    ports: tuple[EndpointPortSpec, ...] = ()
    endpoints: tuple[SliceEndpoint, ...] = ()
    kind: ClassVar[Kind] = Kind.ENDPOINT_SLICE

    @property
    def service_name(self) -> str:
        return self.meta.labels.get("kubernetes.io/service-name", "")


@dataclass(frozen=True, slots=True)
class ContainerPortSpec:
    name: str
    container_port: int
    protocol: str = "TCP"


@dataclass(frozen=True, slots=True)
class KubePod:
    meta: ObjectMeta
    service_account: str = "default"
    node_name: str = ""
    host_network: bool = False
    pod_ips: tuple[str, ...] = ()
    phase: str = ""
    container_ports: tuple[ContainerPortSpec, ...] = ()
    #: The status condition ``Ready``: True, False, or None when the Pod reports no such condition.
    ready: bool | None = None
    kind: ClassVar[Kind] = Kind.POD

    @property
    def ip(self) -> str:
        return self.pod_ips[0] if self.pod_ips else ""


@dataclass(frozen=True, slots=True)
class KubeSecret:
    """A Secret: its type and its data, decoded from base64 (``stringData`` merged over ``data``, as
    the API server does on write). Only what SDS serves from it is read later (see model/credentials)."""

    meta: ObjectMeta
    type: str = "Opaque"
    data: dict[str, bytes] = field(default_factory=dict)
    kind: ClassVar[Kind] = Kind.SECRET


KubeObject = KubeNamespace | KubeNode | KubeService | KubeEndpointSlice | KubePod | KubeSecret


# --- parsing -----------------------------------------------------------------


class _Reader:
    """Typed access to a JSON-like dict that reports the field path of errors."""

    def __init__(self, data: Any, path: str) -> None:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"must be an object, got {type_name(data)}", path)
        self.data: dict[str, Any] = data
        self.path = path

    def _at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def text(self, key: str, default: str = "") -> str:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise ConfigError(f"must be a string, got {type_name(value)}", self._at(key))
        return value

    def opt_text(self, key: str) -> str | None:
        return self.text(key) if self.data.get(key) is not None else None

    def integer(self, key: str, default: int = 0) -> int:
        value = self.data.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"must be an integer, got {type_name(value)}", self._at(key))
        return value

    def flag(self, key: str, default: bool | None = False) -> Any:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ConfigError(f"must be a boolean, got {type_name(value)}", self._at(key))
        return value

    def int_or_text(self, key: str) -> int | str:
        value = self.data.get(key)
        if value is None:
            return 0
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ConfigError(f"must be an integer or a string, got {type_name(value)}", self._at(key))
        return value

    def text_map(self, key: str) -> dict[str, str]:
        value = self.data.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ConfigError(f"must be a map of strings, got {type_name(value)}", self._at(key))
        for k, v in value.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise ConfigError("must be a map of strings", f"{self._at(key)}.{k}")
        return dict(value)

    def child(self, key: str) -> _Reader:
        return _Reader(self.data.get(key), self._at(key))

    def children(self, key: str) -> list[_Reader]:
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise ConfigError(f"must be a list, got {type_name(value)}", self._at(key))
        return [_Reader(item, f"{self._at(key)}[{i}]") for i, item in enumerate(value)]

    def text_list(self, key: str) -> tuple[str, ...]:
        value = self.data.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError("must be a list of strings", self._at(key))
        return tuple(value)


def parse_meta(raw: dict[str, Any], *, namespaced: bool, default_namespace: str = "default") -> ObjectMeta:
    meta = _Reader(raw.get("metadata"), "metadata")
    name = meta.text("name")
    if not name:
        raise ConfigError("name is required", "metadata.name")
    namespace = meta.text("namespace") if namespaced else ""
    if namespaced and not namespace:
        namespace = default_namespace
    owners = tuple((o.text("kind"), o.text("name")) for o in meta.children("ownerReferences"))
    return ObjectMeta(
        name=name,
        namespace=namespace,
        labels=meta.text_map("labels"),
        annotations=meta.text_map("annotations"),
        resource_version=meta.text("resourceVersion"),
        creation_timestamp=_timestamp(meta, "creationTimestamp"),
        deletion_timestamp=_timestamp(meta, "deletionTimestamp"),
        uid=meta.text("uid"),
        owner_references=owners,
    )


def _timestamp(meta: _Reader, key: str) -> str:
    value = meta.data.get(key)
    # The Kubernetes client may hand over datetimes; files give strings.
    if value is not None and not isinstance(value, str):
        return value.isoformat() if hasattr(value, "isoformat") else str(value)
    return meta.text(key)


def parse_namespace(raw: dict[str, Any]) -> KubeNamespace:
    return KubeNamespace(parse_meta(raw, namespaced=False))


def parse_node(raw: dict[str, Any]) -> KubeNode:
    return KubeNode(parse_meta(raw, namespaced=False))


def parse_service(raw: dict[str, Any], default_namespace: str = "default") -> KubeService:
    meta = parse_meta(raw, namespaced=True, default_namespace=default_namespace)
    spec = _Reader(raw.get("spec"), "spec")
    kube_type = spec.text("type", "ClusterIP")
    if kube_type not in ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName"):
        raise ConfigError(f"unsupported service type {kube_type!r}", "spec.type")
    ips = spec.text_list("clusterIPs") or ((spec.text("clusterIP"),) if spec.text("clusterIP") else ())
    ports = []
    for p in spec.children("ports"):
        number = p.integer("port")
        if not 0 < number < 65536:
            raise ConfigError(f"port {number} is out of range 1-65535", f"{p.path}.port")
        ports.append(
            ServicePortSpec(
                name=p.text("name"),
                port=number,
                protocol=p.text("protocol", "TCP"),
                app_protocol=p.opt_text("appProtocol"),
                target_port=p.int_or_text("targetPort") or number,
                node_port=p.integer("nodePort"),
            )
        )
    selector = spec.text_map("selector") if spec.data.get("selector") is not None else None
    external_name = spec.text("externalName")
    if kube_type == "ExternalName" and not external_name:
        raise ConfigError("externalName is required for type ExternalName", "spec.externalName")
    return KubeService(
        meta=meta,
        type=kube_type,
        cluster_ips=ips,
        ports=tuple(ports),
        selector=selector or None,
        external_name=external_name,
        internal_traffic_policy=spec.text("internalTrafficPolicy"),
        publish_not_ready_addresses=bool(spec.flag("publishNotReadyAddresses")),
        traffic_distribution=spec.text("trafficDistribution"),
    )


def parse_endpoint_slice(raw: dict[str, Any], default_namespace: str = "default") -> KubeEndpointSlice:
    meta = parse_meta(raw, namespaced=True, default_namespace=default_namespace)
    top = _Reader(raw, "")
    address_type = top.text("addressType", "IPv4")
    ports = []
    for p in top.children("ports"):
        number = p.integer("port")
        if not 0 <= number < 65536:
            raise ConfigError(f"port {number} is out of range 0-65535", f"{p.path}.port")
        ports.append(
            EndpointPortSpec(
                name=p.text("name"),
                port=number,
                protocol=p.text("protocol", "TCP"),
                app_protocol=p.opt_text("appProtocol"),
            )
        )
    endpoints = []
    for e in top.children("endpoints"):
        addresses = e.text_list("addresses")
        if not addresses:
            raise ConfigError("at least one address is required", f"{e.path}.addresses")
        conditions = e.child("conditions")
        ref = e.child("targetRef")
        target = (
            (ref.text("kind"), ref.text("namespace") or meta.namespace, ref.text("name"))
            if ref.data
            else None
        )
        endpoints.append(
            SliceEndpoint(
                addresses=addresses,
                ready=conditions.flag("ready", None),
                serving=conditions.flag("serving", None),
                terminating=conditions.flag("terminating", None),
                hostname=e.text("hostname"),
                node_name=e.text("nodeName"),
                zone=e.text("zone"),
                target_ref=target,
            )
        )
    return KubeEndpointSlice(
        meta=meta, address_type=address_type, ports=tuple(ports), endpoints=tuple(endpoints)
    )


def parse_pod(raw: dict[str, Any], default_namespace: str = "default") -> KubePod:
    meta = parse_meta(raw, namespaced=True, default_namespace=default_namespace)
    spec = _Reader(raw.get("spec"), "spec")
    status = _Reader(raw.get("status"), "status")
    ips = tuple(ip.text("ip") for ip in status.children("podIPs") if ip.text("ip"))
    if not ips and status.text("podIP"):
        ips = (status.text("podIP"),)
    ports = []
    for c in spec.children("containers"):
        for p in c.children("ports"):
            ports.append(
                ContainerPortSpec(p.text("name"), p.integer("containerPort"), p.text("protocol", "TCP"))
            )
    return KubePod(
        meta=meta,
        service_account=spec.text("serviceAccountName") or spec.text("serviceAccount") or "default",
        node_name=spec.text("nodeName"),
        host_network=bool(spec.flag("hostNetwork")),
        pod_ips=ips,
        phase=status.text("phase"),
        container_ports=tuple(ports),
        ready=_ready_condition(status),
    )


def _ready_condition(status: _Reader) -> bool | None:
    for condition in status.children("conditions"):
        if condition.text("type") == "Ready":
            return condition.text("status") == "True"
    return None


def parse_secret(raw: dict[str, Any], default_namespace: str = "default") -> KubeSecret:
    """A Secret from the API or a file: ``data`` is base64 (as the API serves it), ``stringData`` is
    plain text and wins over ``data`` for the same key (as the API server merges it on write)."""
    meta = parse_meta(raw, namespaced=True, default_namespace=default_namespace)
    top = _Reader(raw, "")
    data: dict[str, bytes] = {}
    for key, value in top.text_map("data").items():
        try:
            data[key] = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise ConfigError("illegal base64 data", f"data.{key}") from None
    for key, value in top.text_map("stringData").items():
        data[key] = value.encode()
    return KubeSecret(meta=meta, type=top.text("type", "Opaque"), data=data)
