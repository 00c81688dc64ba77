"""The resources the test API server serves, and its errors as ``kind: Status`` bodies."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]


@dataclass(frozen=True)
class ResourceType:
    """A served resource; its objects are shared by all its versions (served as aliases)."""

    group: str
    versions: tuple[str, ...]
    plural: str
    kind: str
    namespaced: bool = True

    def api_version(self, version: str | None = None) -> str:
        version = version or self.versions[0]
        return f"{self.group}/{version}" if self.group else version


_ISTIO_NETWORKING = ("v1", "v1beta1", "v1alpha3")
_ISTIO_SECURITY = ("v1", "v1beta1")
RESOURCES: tuple[ResourceType, ...] = (
    ResourceType("", ("v1",), "namespaces", "Namespace", namespaced=False),
    ResourceType("", ("v1",), "nodes", "Node", namespaced=False),
    ResourceType("", ("v1",), "services", "Service"),
    ResourceType("", ("v1",), "pods", "Pod"),
    ResourceType("", ("v1",), "configmaps", "ConfigMap"),
    ResourceType("", ("v1",), "secrets", "Secret"),
    ResourceType("", ("v1",), "endpoints", "Endpoints"),
    ResourceType("discovery.k8s.io", ("v1",), "endpointslices", "EndpointSlice"),
    ResourceType("coordination.k8s.io", ("v1",), "leases", "Lease"),
    *(
        ResourceType("networking.istio.io", _ISTIO_NETWORKING, plural, kind)
        for plural, kind in [
            ("virtualservices", "VirtualService"),
            ("destinationrules", "DestinationRule"),
            ("gateways", "Gateway"),
            ("serviceentries", "ServiceEntry"),
            ("workloadentries", "WorkloadEntry"),
            ("workloadgroups", "WorkloadGroup"),
            ("sidecars", "Sidecar"),
        ]
    ),
    ResourceType("networking.istio.io", ("v1alpha3",), "envoyfilters", "EnvoyFilter"),
    ResourceType("telemetry.istio.io", ("v1", "v1alpha1"), "telemetries", "Telemetry"),
    *(
        ResourceType("security.istio.io", _ISTIO_SECURITY, plural, kind)
        for plural, kind in [
            ("peerauthentications", "PeerAuthentication"),
            ("authorizationpolicies", "AuthorizationPolicy"),
            ("requestauthentications", "RequestAuthentication"),
        ]
    ),
)


def find_resource(name: str) -> ResourceType:
    """A resource by kind (``Pod``), plural (``pods``) or ``plural.group``."""
    for rtype in RESOURCES:
        if name in (rtype.kind, rtype.plural, f"{rtype.plural}.{rtype.group}"):
            return rtype
    raise KeyError(f"not a served resource: {name!r}")


def resource_of(obj: Mapping[str, Any]) -> ResourceType:
    """The resource an object belongs to, from its apiVersion and kind."""
    group = obj.get("apiVersion", "").rpartition("/")[0]
    for rtype in RESOURCES:
        if rtype.group == group and rtype.kind == obj.get("kind"):
            return rtype
    raise KeyError(f"not a served resource: {obj.get('apiVersion')} {obj.get('kind')}")


class StatusError(Exception):
    """An API error answered as a ``kind: Status`` body with the HTTP status ``code``."""

    def __init__(
        self, code: int, reason: str, message: str, rtype: ResourceType | None = None, name: str = ""
    ):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message
        self.details = {"name": name, "group": rtype.group, "kind": rtype.plural} if rtype else {}

    def status(self) -> Obj:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": self.details,
            "code": self.code,
        }
