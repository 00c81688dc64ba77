"""Services and their ports, whichever registry they came from."""

from __future__ import annotations

from dataclasses import dataclass, field

from meshpilot.model.confighash import hash_value
from meshpilot.model.identity import IdentityEnum
from meshpilot.model.protocol import Protocol

#: The address of a service with no VIP (headless, DNS ServiceEntries without addresses).
UNSPECIFIED_IP = "0.0.0.0"


class Resolution(IdentityEnum):
    """How a proxy finds a service's endpoints."""

    #: The proxy load-balances over endpoints it gets by EDS.
    CLIENT_SIDE_LB = "ClientSideLB"
    #: The proxy resolves the endpoints' DNS names (STRICT_DNS).
    DNS_LB = "DNSLB"
    #: The proxy resolves the endpoint name and uses one address at a time (LOGICAL_DNS).
    DNS_ROUND_ROBIN_LB = "DNSRoundRobinLB"
    #: Traffic goes to the address the caller asked for (ORIGINAL_DST).
    PASSTHROUGH = "Passthrough"
    #: A Kubernetes ExternalName service: an alias for another host.
    ALIAS = "Alias"


class Registry(IdentityEnum):
    KUBERNETES = "Kubernetes"
    #: ServiceEntry and WorkloadEntry.
    EXTERNAL = "External"


@dataclass(frozen=True, slots=True)
class Port:
    name: str
    port: int
    protocol: Protocol
    #: Kubernetes targetPort: a number, a container port name, or 0 when unset.
    target_port: int | str = 0


#: Service.traffic_distribution value of ``trafficDistribution: PreferClose``.
PREFER_CLOSE = "PreferClose"


@dataclass(frozen=True, slots=True)
class Service:
    """One hostname in the mesh with its ports.

    A Kubernetes Service yields one; a ServiceEntry yields one per host.
    """

    hostname: str
    namespace: str
    #: The Kubernetes Service or ServiceEntry name.
    name: str
    ports: tuple[Port, ...]
    registry: Registry = Registry.KUBERNETES
    #: The ClusterIP, ServiceEntry address, or UNSPECIFIED_IP.
    default_address: str = UNSPECIFIED_IP
    #: Every address of the service (ClusterIPs, ServiceEntry addresses and CIDRs).
    addresses: tuple[str, ...] = ()
    resolution: Resolution = Resolution.CLIENT_SIDE_LB
    mesh_external: bool = False
    labels: dict[str, str] = field(default_factory=dict)
    #: Pod label selector (Kubernetes) or workloadSelector (ServiceEntry); None selects nothing.
    selector: dict[str, str] | None = None
    #: Namespaces the service is visible to: "*" (all), "." (own), "~" (none) or names;
    #: empty means the mesh default (defaultServiceExportTo).
    export_to: frozenset[str] = frozenset()
    #: Service-level identities (SPIFFE URIs) besides those of the endpoints.
    service_accounts: tuple[str, ...] = ()
    #: For Kubernetes Services: ClusterIP, NodePort, LoadBalancer or ExternalName.
    kube_type: str = ""
    external_name: str = ""
    node_local: bool = False
    creation_timestamp: str = ""
    cluster_id: str = "Kubernetes"
    #: Kubernetes traffic distribution: PREFER_CLOSE keeps traffic near the caller (forced failover).
    traffic_distribution: str = ""
    #: Stable hash of every field above: part of the cache keys of what is built from it.
    fingerprint: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        ports = tuple((p.name, p.port, p.protocol.value, p.target_port) for p in self.ports)
        fields = (
            self.hostname,
            self.namespace,
            self.name,
            ports,
            self.registry.value,
            self.default_address,
            self.addresses,
            self.resolution.value,
            self.mesh_external,
            self.labels,
            self.selector,
            self.export_to,
            self.service_accounts,
            self.kube_type,
            self.external_name,
            self.node_local,
            self.creation_timestamp,
            self.cluster_id,
            self.traffic_distribution,
        )
        object.__setattr__(self, "fingerprint", hash_value(fields))

    def port(self, number: int) -> Port | None:
        for p in self.ports:
            if p.port == number:
                return p
        return None

    def port_by_name(self, name: str) -> Port | None:
        for p in self.ports:
            if p.name == name:
                return p
        return None

    @property
    def is_headless(self) -> bool:
        """No VIP, traffic to the address called: a Kubernetes service with ClusterIP None, or a
        ServiceEntry with resolution NONE and no addresses. Its TCP listeners follow its endpoints."""
        return self.resolution is Resolution.PASSTHROUGH and not self.has_vip

    @property
    def has_vip(self) -> bool:
        return self.default_address != UNSPECIFIED_IP


@dataclass(frozen=True, slots=True)
class ServiceTarget:
    """A service port that a proxy's own workload serves, with the port it listens on."""

    service: Service
    port: Port
    target_port: int
