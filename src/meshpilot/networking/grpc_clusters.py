"""Clusters for proxyless gRPC (istiod 1.28's grpcgen CDS).

gRPC asks for clusters by name, a few at a time (those its routes use). Each
is a plain EDS cluster over ADS; a DestinationRule adds only what gRPC can
use: ring hash or maglev for consistent hashing (round robin otherwise, the
default), and ISTIO_MUTUAL through certificate providers. istiod leaves TLS
off unless a DestinationRule asks for ISTIO_MUTUAL: it cannot know whether
the client uses xDS credentials, and gRPC cannot reach PERMISSIVE servers.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import config_source_pb2

from meshpilot.model.destination_rules import MergedDestinationRule
from meshpilot.model.proxy import Proxy
from meshpilot.model.push_context import PushContext
from meshpilot.model.service import Port, Service
from meshpilot.networking import grpc_tls, names
from meshpilot.networking.endpoint import TLS_ISTIO_MUTUAL
from meshpilot.networking.traffic_policy import ClusterPolicy, apply_load_balancer, cluster_policy

log = logging.getLogger(__name__)


def eds_cluster(name: str) -> Any:
    return cluster_pb2.Cluster(
        name=name,
        alt_stat_name=names.stat_name(name),
        type=cluster_pb2.Cluster.EDS,
        eds_cluster_config=cluster_pb2.Cluster.EdsClusterConfig(
            service_name=name,
            eds_config=config_source_pb2.ConfigSource(ads=config_source_pb2.AggregatedConfigSource()),
        ),
    )


def requested_by_default_cluster(requested: Iterable[str]) -> dict[str, set[str]]:
    """Requested names grouped under their service's default cluster name (``outbound|P||H``)."""
    out: dict[str, set[str]] = {}
    for name in requested:
        parsed = names.parse_cluster(name)
        if parsed is None:
            log.warning("gRPC CDS: cannot parse cluster name %r", name)
            continue
        direction, port, _, host = parsed
        if not host or port == 0:
            log.warning("gRPC CDS: cannot parse cluster name %r", name)
            continue
        out.setdefault(f"{direction}|{port}||{host}", set()).add(name)
    return out


def service_for(proxy: Proxy, push: PushContext, hostname: str) -> Service | None:
    """The service a hostname names for this proxy: its scope's, else the closest namespace's."""
    scope = proxy.sidecar_scope
    found = scope.service(hostname) if scope is not None else None
    if found is not None:
        return found
    candidates = push.services_for_hostname(hostname)
    own = [s for s in candidates if s.namespace == proxy.config_namespace]
    chosen = own or candidates
    return chosen[0] if chosen else None


def _apply_policy(cluster: Any, policy: ClusterPolicy, push: PushContext, svc: Service) -> None:
    if policy.tls is not None and policy.tls.mode == TLS_ISTIO_MUTUAL:
        cluster.transport_socket.CopyFrom(grpc_tls.upstream_transport_socket(push.service_accounts(svc)))
    lb = policy.load_balancer
    if lb is not None and lb.WhichOneof("lb_policy") == "consistent_hash":
        apply_load_balancer(cluster, lb)
    elif lb is not None and lb.WhichOneof("lb_policy") == "simple" and lb.simple not in (0, 4):
        # Only ROUND_ROBIN (4) or unset; gRPC's default stays, as in istiod 1.28.
        log.warning("gRPC CDS: load balancer %s cannot apply to %s", lb.simple, cluster.name)


def clusters_for_service(
    proxy: Proxy, push: PushContext, default_name: str, requested: set[str]
) -> list[Any]:
    """The default cluster (if asked for) and the DestinationRule subset clusters asked for."""
    _, port_number, _, hostname = names.parse_cluster(default_name) or ("", 0, "", "")
    default = eds_cluster(default_name) if default_name in requested else None
    svc = service_for(proxy, push, hostname)
    port: Port | None = svc.port(port_number) if svc is not None else None
    if svc is None or port is None:
        # Unknown service or port: a bare cluster, as istiod (it may appear later).
        log.warning("%s: gRPC CDS: no service port for %s", proxy.id, default_name)
        return [default] if default is not None else []
    scope = proxy.sidecar_scope
    rule: MergedDestinationRule | None = scope.destination_rule(hostname) if scope is not None else None
    out = []
    if default is not None:
        _apply_policy(default, cluster_policy(rule, "", port_number), push, svc)
        out.append(default)
    for subset in rule.subsets if rule is not None else ():
        name = names.outbound_cluster(port_number, subset.name, hostname)
        if name not in requested:
            continue
        cluster = eds_cluster(name)
        _apply_policy(cluster, cluster_policy(rule, subset.name, port_number), push, svc)
        out.append(cluster)
    return out


def build_grpc_clusters(proxy: Proxy, push: PushContext, requested: Iterable[str]) -> list[Any]:
    out = []
    for default_name, wanted in sorted(requested_by_default_cluster(requested).items()):
        out.extend(clusters_for_service(proxy, push, default_name, wanted))
    return out
