"""ServiceEntries and WorkloadEntries into services and endpoints, as istiod converts them."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from meshpilot.config.core_objects import KubePod
from meshpilot.model import labels as wk
from meshpilot.model.config import Config
from meshpilot.model.endpoint import TLS_MODE_DISABLED, TLS_MODE_ISTIO, Endpoint, Locality
from meshpilot.model.protocol import Protocol
from meshpilot.model.service import UNSPECIFIED_IP, Port, Registry, Resolution, Service
from meshpilot.model.spiffe import spiffe_identity
from meshpilot.registry.kube.conversion import workload_name

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
            # istiod names a ServiceEntry's services after their hosts (cluster metadata shows it).
            name=host,
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


def workload_entry_labels(config: Config) -> dict[str, str]:
    """A WorkloadEntry's spec labels merged with its metadata labels, which win.

    istiod's ConvertWorkloadEntry does the same before selecting.
    """
    return {**dict(config.spec.labels), **config.meta.labels}


def dns_only_address(address: str) -> bool:
    """A unix socket or a hostname: only a DNS ServiceEntry can use such a workload.

    istiod marks these workloads DNSServiceEntryOnly.
    """
    if address.startswith("unix://"):
        return True
    if not address:
        return False
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return True
    return False


def selects_dns_only(service: Service) -> bool:
    """Whether workloads addressed by name may back ``service``."""
    return service.resolution in (Resolution.DNS_LB, Resolution.DNS_ROUND_ROBIN_LB)


def _target_port(port: Any, port_map: Mapping[str, int]) -> int:
    """The workload's own port for the name, else the ServiceEntry's targetPort, else its number."""
    if port_map.get(port.name, 0) > 0:
        return port_map[port.name]
    if port.target_port > 0:
        return int(port.target_port)
    return int(port.number)


def workload_endpoints(
    we: Any,
    *,
    namespace: str,
    name: str,
    service_ports: list[Any],
    cluster_id: str,
    trust_domain: str,
    labels: Mapping[str, str] | None = None,
) -> list[Endpoint]:
    """Endpoints of one WorkloadEntry (inline or standalone) for each ServiceEntry port.

    ``labels`` replaces the entry's own (a standalone entry's merged labels).
    """
    own = dict(we.labels) if labels is None else dict(labels)
    locality = we.locality or own.get(wk.ISTIO_LOCALITY, "").replace(".", "/")
    sa = spiffe_identity(trust_domain, namespace, we.service_account) if we.service_account else ""
    topology = wk.with_topology(own, locality=locality, cluster_id=cluster_id, network=we.network)
    out = []
    for port in service_ports:
        address = we.address
        target = 0 if address.startswith("unix://") else _target_port(port, we.ports)
        out.append(
            Endpoint(
                address=address,
                port=target,
                service_port_name=port.name,
                labels=topology,
                service_account=sa,
                tls_mode=_workload_tls_mode(own, we.service_account),
                locality=Locality(locality, cluster_id),
                network=we.network,
                workload_name=name,
                namespace=namespace,
                weight=we.weight or 1,
            )
        )
    return out


def pod_port_map(pod: KubePod) -> dict[str, int]:
    """Named TCP container ports, the first of a name winning (istiod's getPortMap)."""
    out: dict[str, int] = {}
    for port in pod.container_ports:
        if port.name and port.protocol.upper() == "TCP":
            out.setdefault(port.name, port.container_port)
    return out


def pod_selectable(pod: KubePod) -> bool:
    """Whether a Pod backs ServiceEntries that select it: it has an IP and is ready.

    istiod takes Pods whose Ready condition is True and that are not being
    deleted; a Pod that reports no conditions (as hand-written files often
    do) counts as ready when Running.
    """
    if not pod.ip or pod.meta.deletion_timestamp:
        return False
    return pod.ready if pod.ready is not None else pod.phase == "Running"


def pod_endpoints(
    pod: KubePod, *, locality: str, service_ports: list[Any], cluster_id: str, trust_domain: str
) -> list[Endpoint]:
    """Endpoints of a Pod a ServiceEntry's workloadSelector picks, one per ServiceEntry port.

    The port is the Pod's container port of the ServiceEntry port's name, else
    the targetPort, else the port number (istiod's convertWorkloadInstanceToServiceInstance).
    """
    labels = wk.with_topology(dict(pod.meta.labels), locality=locality, cluster_id=cluster_id, network="")
    port_map = pod_port_map(pod)
    sa = spiffe_identity(trust_domain, pod.meta.namespace, pod.service_account)
    return [
        Endpoint(
            address=pod.ip,
            port=_target_port(port, port_map),
            service_port_name=port.name,
            labels=labels,
            service_account=sa,
            tls_mode=pod.meta.labels.get(wk.TLS_MODE, TLS_MODE_DISABLED),
            locality=Locality(locality, cluster_id),
            workload_name=workload_name(pod),
            namespace=pod.meta.namespace,
            extra_addresses=pod.pod_ips[1:],
        )
        for port in service_ports
    ]


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
