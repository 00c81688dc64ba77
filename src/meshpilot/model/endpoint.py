"""Endpoints: one workload address serving one port of a service."""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass, field

from meshpilot.model import labels as wk


class HealthStatus(enum.IntEnum):
    """Numbered as Envoy's ``core.v3.HealthStatus``."""

    HEALTHY = 1
    UNHEALTHY = 2
    DRAINING = 3
    TERMINATING = 4


#: Value of the ``security.istio.io/tlsMode`` label for workloads with a sidecar.
TLS_MODE_ISTIO = "istio"
TLS_MODE_DISABLED = "disabled"


@dataclass(frozen=True, slots=True)
class Locality:
    """Where a workload runs: ``region/zone/subzone`` and its cluster."""

    label: str = ""
    cluster_id: str = "Kubernetes"

    @property
    def region(self) -> str:
        return self.label.split("/")[0] if self.label else ""

    @property
    def zone(self) -> str:
        parts = self.label.split("/")
        return parts[1] if len(parts) > 1 else ""

    @property
    def subzone(self) -> str:
        parts = self.label.split("/")
        return parts[2] if len(parts) > 2 else ""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """An instance of one service port (istiod's ``IstioEndpoint``)."""

    address: str
    #: The port the workload listens on (Kubernetes targetPort).
    port: int
    #: Name of the service port this endpoint serves; matches ``Port.name``.
    service_port_name: str
    labels: dict[str, str] = field(default_factory=dict)
    #: SPIFFE identity, ``spiffe://<trust-domain>/ns/<ns>/sa/<sa>``, or "".
    service_account: str = ""
    tls_mode: str = TLS_MODE_DISABLED
    locality: Locality = field(default_factory=Locality)
    network: str = ""
    #: Workload (Deployment-like) name, for telemetry metadata.
    workload_name: str = ""
    namespace: str = ""
    #: Pod hostname and subdomain for headless services.
    hostname: str = ""
    subdomain: str = ""
    node_name: str = ""
    health: HealthStatus = HealthStatus.HEALTHY
    weight: int = 1
    #: Extra addresses of a dual-stack workload.
    extra_addresses: tuple[str, ...] = ()
    #: ``workload;namespace;canonical-name;canonical-revision;cluster``, the telemetry
    #: metadata EDS carries; computed once here rather than per push.
    telemetry: str = field(default="", compare=False)
    #: Whether ``address`` is an IP (else a DNS name or a Unix socket); computed once.
    is_ip: bool = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_ip", _is_ip(self.address))
        if not self.telemetry:
            object.__setattr__(self, "telemetry", _telemetry(self))

    @property
    def key(self) -> tuple[str, int, str]:
        return (self.address, self.port, self.service_port_name)


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _telemetry(ep: Endpoint) -> str:
    revision = wk.canonical_revision(ep.labels)
    return ";".join(
        (
            ep.workload_name,
            ep.namespace,
            wk.canonical_service(ep.labels, ep.workload_name),
            "" if revision == "latest" else revision,
            ep.locality.cluster_id,
        )
    )
