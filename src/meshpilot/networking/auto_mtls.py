"""Automatic mutual TLS on the client side: whether an outbound cluster offers mTLS without a
DestinationRule asking for it, as istiod decides (``buildUpstreamTLSSettings`` with
``BestEffortInferServiceMTLSMode``, pilot/pkg/networking/core/cluster_tls.go and push_context.go).

One rule for both cluster builders (``cluster.py``, ``cluster_wire.py``): auto mTLS applies when
MeshConfig ``enableAutoMtls`` is on, the service is in the mesh, and the service's inferred mTLS
mode is neither DISABLE nor unknown. The inferred mode is coarse on purpose, as istiod's: the
namespace-wide PeerAuthentication of the service's namespace, else the mesh-wide one, else
PERMISSIVE; workload and port-level policies are not read here (each endpoint's mode is, in EDS:
``networking/endpoint.py``). A passthrough service (headless, or a load balancer of PASSTHROUGH)
is DISABLE unless every endpoint of the port carries a sidecar.
"""

from __future__ import annotations

from typing import Any

from meshpilot.model.destination_rules import MergedDestinationRule
from meshpilot.model.endpoint import TLS_MODE_DISABLED
from meshpilot.model.endpoint_index import EndpointIndex
from meshpilot.model.peer_authentication import MtlsMode
from meshpilot.model.push_context import PushContext
from meshpilot.model.service import Port, Resolution, Service

_LB_PASSTHROUGH = 3


def _passthrough_lb(policy: Any | None) -> bool:
    if policy is None or not policy.HasField("load_balancer"):
        return False
    lb = policy.load_balancer
    return bool(lb.WhichOneof("lb_policy") == "simple" and lb.simple == _LB_PASSTHROUGH)


def _policy_for(rule: MergedDestinationRule | None, subset: str) -> Any | None:
    """The traffic policy istiod reads here: the rule's own for the default cluster, the subset's
    own (not merged with the rule's) for a subset cluster."""
    if rule is None:
        return None
    if not subset:
        return rule.traffic_policy
    found = rule.subset(subset)
    return found.traffic_policy if found is not None and found.HasField("traffic_policy") else None


def _reads_endpoints(svc: Service, rule: MergedDestinationRule | None, subset: str) -> bool:
    return svc.resolution is Resolution.PASSTHROUGH or _passthrough_lb(_policy_for(rule, subset))


def mode_reads_endpoints(svc: Service, rule: MergedDestinationRule | None) -> bool:
    """Whether the inferred mode of any of ``svc``'s clusters (``service_mtls_mode``) reads its
    endpoints, which an endpoint push changes without building clusters again."""
    if svc.mesh_external:
        return False
    subsets = [s.name for s in rule.subsets] if rule is not None else []
    return any(_reads_endpoints(svc, rule, subset) for subset in ("", *subsets))


def service_mtls_mode(
    push: PushContext,
    index: EndpointIndex,
    svc: Service,
    port: Port,
    rule: MergedDestinationRule | None,
    subset: str,
) -> MtlsMode:
    """istiod's BestEffortInferServiceMTLSMode for one cluster."""
    if svc.mesh_external:
        return MtlsMode.UNKNOWN
    if _reads_endpoints(svc, rule, subset):
        shards = index.shards(svc.hostname, svc.namespace)
        endpoints = [ep for _, ep in shards.endpoints()] if shards is not None else []
        served = [ep for ep in endpoints if ep.service_port_name == port.name]
        if not served or any(ep.tls_mode == TLS_MODE_DISABLED for ep in served):
            return MtlsMode.DISABLE
    return push.peer_authentication.service_mode(svc.namespace)


def auto_mtls_applies(mode: MtlsMode, push: PushContext) -> bool:
    """Whether a cluster without DestinationRule TLS gets auto mTLS, given its service's mode."""
    if not push.mesh.enable_auto_mtls.value:
        return False
    return mode not in (MtlsMode.UNKNOWN, MtlsMode.DISABLE)
