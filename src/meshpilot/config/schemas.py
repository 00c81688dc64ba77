"""Which kinds meshpilot reads, in which API versions, and how each is parsed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message

from meshpilot._proto.istio.networking.v1alpha3 import (
    destination_rule_pb2,
    envoy_filter_pb2,
    gateway_pb2,
    service_entry_pb2,
    sidecar_pb2,
    virtual_service_pb2,
    workload_entry_pb2,
    workload_group_pb2,
)
from meshpilot._proto.istio.security.v1beta1 import (
    authorization_policy_pb2,
    peer_authentication_pb2,
    request_authentication_pb2,
)
from meshpilot._proto.istio.telemetry.v1alpha1 import telemetry_pb2
from meshpilot.config import core_objects
from meshpilot.config.errors import ConfigError
from meshpilot.model.kind import Kind

_NETWORKING_VERSIONS = ("v1", "v1beta1", "v1alpha3")
_SECURITY_VERSIONS = ("v1", "v1beta1")


@dataclass(frozen=True, slots=True)
class Schema:
    kind: Kind
    group: str
    #: Accepted versions, preferred first; all parse into the same message.
    versions: tuple[str, ...]
    plural: str
    cluster_scoped: bool = False
    #: The spec message of an Istio kind.
    message: type[Message] | None = None
    #: The parser of a core Kubernetes kind.
    parse_core: Callable[..., core_objects.KubeObject] | None = None

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.versions[0]}" if self.group else self.versions[0]

    def new_spec(self) -> Any:
        assert self.message is not None
        return self.message()


def _istio(kind: Kind, message: type[Message], plural: str, versions: tuple[str, ...]) -> Schema:
    return Schema(kind, kind.group, versions, plural, message=message)


SCHEMAS: dict[Kind, Schema] = {
    s.kind: s
    for s in (
        Schema(
            Kind.NAMESPACE,
            "",
            ("v1",),
            "namespaces",
            cluster_scoped=True,
            parse_core=core_objects.parse_namespace,
        ),
        Schema(Kind.NODE, "", ("v1",), "nodes", cluster_scoped=True, parse_core=core_objects.parse_node),
        Schema(Kind.SERVICE, "", ("v1",), "services", parse_core=core_objects.parse_service),
        Schema(Kind.POD, "", ("v1",), "pods", parse_core=core_objects.parse_pod),
        Schema(Kind.SECRET, "", ("v1",), "secrets", parse_core=core_objects.parse_secret),
        Schema(
            Kind.ENDPOINT_SLICE,
            "discovery.k8s.io",
            ("v1",),
            "endpointslices",
            parse_core=core_objects.parse_endpoint_slice,
        ),
        _istio(
            Kind.VIRTUAL_SERVICE, virtual_service_pb2.VirtualService, "virtualservices", _NETWORKING_VERSIONS
        ),
        _istio(
            Kind.DESTINATION_RULE,
            destination_rule_pb2.DestinationRule,
            "destinationrules",
            _NETWORKING_VERSIONS,
        ),
        _istio(Kind.GATEWAY, gateway_pb2.Gateway, "gateways", _NETWORKING_VERSIONS),
        _istio(Kind.SERVICE_ENTRY, service_entry_pb2.ServiceEntry, "serviceentries", _NETWORKING_VERSIONS),
        _istio(
            Kind.WORKLOAD_ENTRY, workload_entry_pb2.WorkloadEntry, "workloadentries", _NETWORKING_VERSIONS
        ),
        _istio(Kind.WORKLOAD_GROUP, workload_group_pb2.WorkloadGroup, "workloadgroups", _NETWORKING_VERSIONS),
        _istio(Kind.SIDECAR, sidecar_pb2.Sidecar, "sidecars", _NETWORKING_VERSIONS),
        _istio(Kind.ENVOY_FILTER, envoy_filter_pb2.EnvoyFilter, "envoyfilters", ("v1alpha3",)),
        _istio(
            Kind.PEER_AUTHENTICATION,
            peer_authentication_pb2.PeerAuthentication,
            "peerauthentications",
            _SECURITY_VERSIONS,
        ),
        _istio(
            Kind.AUTHORIZATION_POLICY,
            authorization_policy_pb2.AuthorizationPolicy,
            "authorizationpolicies",
            _SECURITY_VERSIONS,
        ),
        _istio(
            Kind.REQUEST_AUTHENTICATION,
            request_authentication_pb2.RequestAuthentication,
            "requestauthentications",
            _SECURITY_VERSIONS,
        ),
        _istio(Kind.TELEMETRY, telemetry_pb2.Telemetry, "telemetries", ("v1", "v1alpha1")),
    )
}

_BY_GROUP_KIND = {(s.group, s.kind.value): s for s in SCHEMAS.values()}


def lookup(api_version: str, kind: str) -> Schema:
    """The schema for an object's apiVersion and kind; ConfigError if unsupported."""
    group, _, version = api_version.rpartition("/")
    schema = _BY_GROUP_KIND.get((group, kind))
    if schema is None:
        where = f"{group}/{kind}" if group else kind
        raise ConfigError(f"unknown kind {where}", "kind")
    if version not in schema.versions:
        accepted = ", ".join(f"{group}/{v}" if group else v for v in schema.versions)
        raise ConfigError(f"unsupported version {api_version} of {kind} (accepted: {accepted})", "apiVersion")
    return schema
