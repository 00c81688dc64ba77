"""The kinds of objects meshpilot reads, named as Kubernetes and Istio name them."""

from __future__ import annotations

from meshpilot.model.identity import IdentityEnum


class Kind(IdentityEnum):
    """A config or registry kind. The value is its Kubernetes ``kind``."""

    # Core Kubernetes objects feeding the Kubernetes registry.
    NAMESPACE = "Namespace"
    SERVICE = "Service"
    ENDPOINT_SLICE = "EndpointSlice"
    POD = "Pod"
    NODE = "Node"
    #: TLS credentials served over SDS (``credentialName``); not part of any registry.
    SECRET = "Secret"
    # networking.istio.io
    VIRTUAL_SERVICE = "VirtualService"
    DESTINATION_RULE = "DestinationRule"
    GATEWAY = "Gateway"
    SERVICE_ENTRY = "ServiceEntry"
    WORKLOAD_ENTRY = "WorkloadEntry"
    WORKLOAD_GROUP = "WorkloadGroup"
    SIDECAR = "Sidecar"
    ENVOY_FILTER = "EnvoyFilter"
    # security.istio.io
    PEER_AUTHENTICATION = "PeerAuthentication"
    AUTHORIZATION_POLICY = "AuthorizationPolicy"
    REQUEST_AUTHENTICATION = "RequestAuthentication"
    # telemetry.istio.io
    TELEMETRY = "Telemetry"
    # Not objects of their own: push triggers use these in ConfigKeys.
    MESH_CONFIG = "MeshConfig"

    @property
    def group(self) -> str:
        return _GROUPS[self]

    @property
    def is_istio(self) -> bool:
        return self.group.endswith("istio.io")

    def __repr__(self) -> str:
        return f"Kind.{self.name}"


_GROUPS = {
    Kind.NAMESPACE: "",
    Kind.SERVICE: "",
    Kind.POD: "",
    Kind.NODE: "",
    Kind.SECRET: "",
    Kind.ENDPOINT_SLICE: "discovery.k8s.io",
    Kind.VIRTUAL_SERVICE: "networking.istio.io",
    Kind.DESTINATION_RULE: "networking.istio.io",
    Kind.GATEWAY: "networking.istio.io",
    Kind.SERVICE_ENTRY: "networking.istio.io",
    Kind.WORKLOAD_ENTRY: "networking.istio.io",
    Kind.WORKLOAD_GROUP: "networking.istio.io",
    Kind.SIDECAR: "networking.istio.io",
    Kind.ENVOY_FILTER: "networking.istio.io",
    Kind.PEER_AUTHENTICATION: "security.istio.io",
    Kind.AUTHORIZATION_POLICY: "security.istio.io",
    Kind.REQUEST_AUTHENTICATION: "security.istio.io",
    Kind.TELEMETRY: "telemetry.istio.io",
    Kind.MESH_CONFIG: "mesh.istio.io",
}
