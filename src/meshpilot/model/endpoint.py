"""Endpoints: one workload address serving one port of a service."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


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

    @property
    def key(self) -> tuple[str, int, str]:
        return (self.address, self.port, self.service_port_name)
