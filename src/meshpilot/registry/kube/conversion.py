"""Kubernetes objects into the mesh model, as istiod converts them."""

from __future__ import annotations

from meshpilot.config.core_objects import KubeEndpointSlice, KubeNode, KubePod, KubeService
from meshpilot.model import labels as wk
from meshpilot.model.endpoint import Endpoint, HealthStatus, Locality
from meshpilot.model.protocol import kube_port_protocol
from meshpilot.model.service import PREFER_CLOSE, UNSPECIFIED_IP, Port, Registry, Resolution, Service
from meshpilot.model.spiffe import spiffe_identity

EXPORT_TO_ANNOTATION = "networking.istio.io/exportTo"
CANONICAL_SA_ANNOTATION = "alpha.istio.io/canonical-serviceaccounts"
KUBE_SA_ANNOTATION = "alpha.istio.io/kubernetes-serviceaccounts"
#: The older way to ask for what ``spec.trafficDistribution`` asks.
TRAFFIC_DISTRIBUTION_ANNOTATION = "networking.istio.io/traffic-distribution"


def service_hostname(name: str, namespace: str, domain_suffix: str) -> str:
    return f"{name}.{namespace}.svc.{domain_suffix}"


def convert_service(svc: KubeService, *, domain_suffix: str, cluster_id: str, trust_domain: str) -> Service:
    meta = svc.meta
    resolution = Resolution.CLIENT_SIDE_LB
    external_name = ""
    if svc.type == "ExternalName" and svc.external_name:
        external_name = svc.external_name
        resolution = Resolution.ALIAS
    addresses: tuple[str, ...] = (UNSPECIFIED_IP,)
    if svc.is_headless:
        resolution = Resolution.PASSTHROUGH
    elif svc.cluster_ips and svc.cluster_ips[0]:
        addresses = svc.cluster_ips
    ports = tuple(
        Port(p.name, p.port, kube_port_protocol(p.name, p.port, p.app_protocol, p.protocol), p.target_port)
        for p in svc.ports
    )
    accounts: list[str] = []
    if meta.annotations.get(CANONICAL_SA_ANNOTATION):
        accounts.extend(meta.annotations[CANONICAL_SA_ANNOTATION].split(","))
    if meta.annotations.get(KUBE_SA_ANNOTATION):
        accounts.extend(
            spiffe_identity(trust_domain, meta.namespace, sa)
            for sa in meta.annotations[KUBE_SA_ANNOTATION].split(",")
        )
    export_to: frozenset[str] = frozenset()
    if meta.annotations.get(EXPORT_TO_ANNOTATION):
        export_to = frozenset(ns.strip() for ns in meta.annotations[EXPORT_TO_ANNOTATION].split(","))
    return Service(
        hostname=service_hostname(meta.name, meta.namespace, domain_suffix),
        namespace=meta.namespace,
        name=meta.name,
        ports=ports,
        registry=Registry.KUBERNETES,
        default_address=addresses[0],
        addresses=tuple(a for a in addresses if a != UNSPECIFIED_IP),
        resolution=resolution,
        mesh_external=bool(external_name),
        labels=dict(meta.labels),
        selector=dict(svc.selector) if svc.selector is not None else None,
        export_to=export_to,
        service_accounts=tuple(accounts),
        kube_type=svc.type,
        external_name=external_name,
        node_local=svc.internal_traffic_policy == "Local",
        creation_timestamp=meta.creation_timestamp,
        cluster_id=cluster_id,
        traffic_distribution=traffic_distribution(svc),
    )


def traffic_distribution(svc: KubeService) -> str:
    """PREFER_CLOSE from the spec field, else from the annotation (any case), as istiod reads them."""
    if svc.traffic_distribution == PREFER_CLOSE:
        return PREFER_CLOSE
    annotation = svc.meta.annotations.get(TRAFFIC_DISTRIBUTION_ANNOTATION, "")
    return PREFER_CLOSE if annotation.lower() == PREFER_CLOSE.lower() else ""


def node_locality(node: KubeNode | None) -> str:
    """``region/zone/subzone`` from a Node's topology labels; "" if it has none."""
    if node is None:
        return ""
    labels = node.meta.labels
    region, zone, subzone = labels.get(wk.REGION, ""), labels.get(wk.ZONE, ""), labels.get(wk.SUBZONE, "")
    if not (region or zone or subzone):
        return ""
    return f"{region}/{zone}/{subzone}"


def pod_locality(pod: KubePod | None, node: KubeNode | None) -> str:
    if pod is not None and pod.meta.labels.get(wk.ISTIO_LOCALITY):
        return pod.meta.labels[wk.ISTIO_LOCALITY].replace(".", "/")
    return node_locality(node)


def workload_name(pod: KubePod) -> str:
    """The Deployment-like owner's name: a ReplicaSet's hash suffix is dropped."""
    for kind, name in pod.meta.owner_references:
        if kind == "ReplicaSet":
            template_hash = pod.meta.labels.get("pod-template-hash")
            if template_hash and name.endswith("-" + template_hash):
                return name[: -len(template_hash) - 1]
            return name
        return name
    return pod.meta.name


def health_of(ready: bool | None, terminating: bool | None) -> HealthStatus:
    if ready is None or ready:
        return HealthStatus.HEALTHY
    if terminating is None or terminating:
        return HealthStatus.TERMINATING
    return HealthStatus.UNHEALTHY


def slice_endpoints(
    es: KubeEndpointSlice,
    *,
    pods_by_name: dict[tuple[str, str], KubePod],
    pods_by_ip: dict[str, KubePod],
    nodes: dict[str, KubeNode],
    cluster_id: str,
    trust_domain: str,
    network: str = "",
) -> tuple[list[Endpoint], list[tuple[str, str]]]:
    """Endpoints of one EndpointSlice, and the Pods they wait for.

    An endpoint whose target Pod is not known yet is left out until the Pod
    arrives (istiod does the same), so it never carries the wrong identity.
    """
    out: list[Endpoint] = []
    pending: list[tuple[str, str]] = []
    if es.address_type == "FQDN":
        return out, pending
    for e in es.endpoints:
        pod: KubePod | None = None
        if e.target_ref is not None and e.target_ref[0] == "Pod":
            pod = pods_by_name.get((e.target_ref[1], e.target_ref[2]))
            if pod is None:
                pending.append((e.target_ref[1], e.target_ref[2]))
                continue
        else:
            pod = pods_by_ip.get(e.addresses[0])
        node_name = e.node_name or (pod.node_name if pod is not None else "")
        node = nodes.get(node_name)
        locality = pod_locality(pod, node)
        pod_labels = pod.meta.labels if pod is not None else {}
        endpoint_labels = wk.with_topology(
            pod_labels, locality=locality, cluster_id=cluster_id, network=network
        )
        sa = spiffe_identity(trust_domain, pod.meta.namespace, pod.service_account) if pod is not None else ""
        health = health_of(e.ready, e.terminating)
        for port in es.ports:
            out.append(
                Endpoint(
                    address=e.addresses[0],
                    port=port.port,
                    service_port_name=port.name,
                    labels=endpoint_labels,
                    service_account=sa,
                    tls_mode=pod_labels.get(wk.TLS_MODE, "disabled"),
                    locality=Locality(locality, cluster_id),
                    network=network,
                    workload_name=workload_name(pod) if pod is not None else "",
                    namespace=es.meta.namespace,
                    hostname=e.hostname,
                    node_name=node_name,
                    health=health,
                    extra_addresses=e.addresses[1:],
                )
            )
    return out, pending
