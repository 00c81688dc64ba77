"""Label selection and the well-known labels meshpilot reads and adds."""

from __future__ import annotations

from collections.abc import Mapping

TLS_MODE = "security.istio.io/tlsMode"
CANONICAL_NAME = "service.istio.io/canonical-name"
CANONICAL_REVISION = "service.istio.io/canonical-revision"
REGION = "topology.kubernetes.io/region"
ZONE = "topology.kubernetes.io/zone"
SUBZONE = "topology.istio.io/subzone"
CLUSTER = "topology.istio.io/cluster"
NETWORK = "topology.istio.io/network"
#: Pod label overriding the locality, written ``region.zone.subzone``.
ISTIO_LOCALITY = "istio-locality"
SERVICE_NAME = "kubernetes.io/service-name"


def selector_matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """True when every selector label is present with the same value.

    An empty selector matches everything, as in Kubernetes.
    """
    return all(labels.get(k) == v for k, v in selector.items())


def canonical_service(labels: Mapping[str, str], workload_name: str) -> str:
    return (
        labels.get(CANONICAL_NAME)
        or labels.get("app.kubernetes.io/name")
        or labels.get("app")
        or workload_name
    )


def canonical_revision(labels: Mapping[str, str]) -> str:
    return (
        labels.get(CANONICAL_REVISION)
        or labels.get("app.kubernetes.io/version")
        or labels.get("version")
        or "latest"
    )


def with_topology(
    labels: Mapping[str, str], *, locality: str, cluster_id: str, network: str = ""
) -> dict[str, str]:
    """Workload labels plus the topology labels istiod adds to endpoints."""
    out = dict(labels)
    parts = locality.split("/") if locality else []
    for key, value in zip((REGION, ZONE, SUBZONE), parts, strict=False):
        if value:
            out[key] = value
    if cluster_id:
        out[CLUSTER] = cluster_id
    if network:
        out[NETWORK] = network
    return out
