"""ServiceEntries and WorkloadEntries into services and endpoints, as istiod converts them."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from meshpilot.model import labels as wk
from meshpilot.model.config import Config
from meshpilot.model.endpoint import TLS_MODE_DISABLED, TLS_MODE_ISTIO, Endpoint, Locality
from meshpilot.model.protocol import Protocol
from meshpilot.model.service import UNSPECIFIED_IP, Port, Registry, Resolution, Service
from meshpilot.registry.kube.conversion import spiffe_identity

# ServiceEntry.Location and ServiceEntry.Resolution enum numbers.
MESH_EXTERNAL = 0
_RESOLUTIONS = {
    0: Resolution.PASSTHROUGH,  # NONE
    1: Resolution.CLIENT_SIDE_LB,  # STATIC
    2: Resolution.DNS_LB,  # DNS
    3: Resolution.DNS_ROUND_ROBIN_LB,  # DNS_ROUND_ROBIN
}


def _address(text: str) -> str | None:
    """An IP as written, a CIDR (a /32 or /128 becomes its IP), or None if neither."""
    try:
        ipaddress.ip_address(text)
        return text
    except ValueError:
        pass
    try:
        net = ipaddress.ip_network(text, strict=False)
    except ValueError:
        return None
    return str(net.network_address) if net.prefixlen == net.max_prefixlen else text


def convert_services(config: Config) -> list[Service]:
    """One service per host of a ServiceEntry."""
    se: Any = config.spec
    resolution = _RESOLUTIONS.get(se.resolution, Resolution.CLIENT_SIDE_LB)
    ports = tuple(Port(p.name, p.number, Protocol.parse(p.protocol), p.target_port) for p in se.ports)
    addresses = tuple(a for a in (_address(x) for x in se.addresses) if a is not None)
    selector = dict(se.workload_selector.labels) if se.HasField("workload_selector") else None
    return [
        Service(
            hostname=host,
            namespace=config.namespace,
            name=config.name,
            ports=ports,
            registry=Registry.EXTERNAL,
            default_address=addresses[0] if addresses else UNSPECIFIED_IP,
            addresses=addresses,
            resolution=resolution,
            mesh_external=se.location == MESH_EXTERNAL,
            labels=dict(config.meta.labels),
            selector=selector,
            export_to=frozenset(se.export_to),
            service_accounts=tuple(se.subject_alt_names),
            creation_timestamp=config.meta.creation_timestamp,
        )
        for host in se.hosts
    ]


def _workload_tls_mode(labels: Mapping[str, str], service_account: str) -> str:
    if wk.TLS_MODE in labels:
        return labels[wk.TLS_MODE]
    return TLS_MODE_ISTIO if service_account else TLS_MODE_DISABLED


def workload_endpoints(
    we: Any,
    *,
    namespace: str,
    name: str,
    service_ports: list[Any],
    cluster_id: str,
    trust_domain: str,
) -> list[Endpoint]:
    """Endpoints of one WorkloadEntry (inline or standalone) for each ServiceEntry port."""
    locality = we.locality or dict(we.labels).get(wk.ISTIO_LOCALITY, "").replace(".", "/")
    sa = spiffe_identity(trust_domain, namespace, we.service_account) if we.service_account else ""
    labels = wk.with_topology(dict(we.labels), locality=locality, cluster_id=cluster_id, network=we.network)
    out = []
    for port in service_ports:
        address = we.address
        if address.startswith("unix://"):
            address, target = address, 0
        elif we.ports.get(port.name, 0) > 0:
            target = we.ports[port.name]
        elif port.target_port > 0:
            target = port.target_port
        else:
            target = port.number
        out.append(
            Endpoint(
                address=address,
                port=target,
                service_port_name=port.name,
                labels=labels,
                service_account=sa,
                tls_mode=_workload_tls_mode(we.labels, we.service_account),
                locality=Locality(locality, cluster_id),
                network=we.network,
                workload_name=name,
                namespace=namespace,
                weight=we.weight or 1,
            )
        )
    return out


def inline_endpoints(
    config: Config, service: Service, *, cluster_id: str, trust_domain: str
) -> list[Endpoint]:
    """Endpoints a ServiceEntry defines itself, or its host when it resolves by DNS alone."""
    se: Any = config.spec
    ports = list(se.ports)
    if (
        not se.endpoints
        and not se.HasField("workload_selector")
        and service.resolution
        in (
            Resolution.DNS_LB,
            Resolution.DNS_ROUND_ROBIN_LB,
        )
    ):
        return [
            Endpoint(
                address=service.hostname,
                port=p.target_port or p.number,
                service_port_name=p.name,
                tls_mode=TLS_MODE_DISABLED,
                locality=Locality("", cluster_id),
                namespace=config.namespace,
                workload_name=config.name,
            )
            for p in ports
        ]
    out: list[Endpoint] = []
    for i, we in enumerate(se.endpoints):
        out.extend(
            workload_endpoints(
                we,
                namespace=config.namespace,
                name=f"{config.name}-{i}",
                service_ports=ports,
                cluster_id=cluster_id,
                trust_domain=trust_domain,
            )
        )
    return out
