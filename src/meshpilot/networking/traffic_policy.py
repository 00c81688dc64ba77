"""DestinationRule traffic policies applied to clusters, as istiod applies them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from envoy.config.cluster.v3 import circuit_breaker_pb2, cluster_pb2, outlier_detection_pb2
from envoy.config.core.v3 import protocol_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2 as hpo
from envoy.type.v3 import percent_pb2

from meshpilot.model.destination_rules import MergedDestinationRule
from meshpilot.networking.protobuf import uint32

_MAX = 0xFFFFFFFF
# LoadBalancerSettings.SimpleLB numbers.
_LEAST_CONN, _RANDOM, _PASSTHROUGH, _ROUND_ROBIN, _LEAST_REQUEST = 1, 2, 3, 4, 5
_FIELDS = ("connection_pool", "load_balancer", "outlier_detection", "tls")


@dataclass(frozen=True, slots=True)
class ClusterPolicy:
    """The traffic policy that applies to one cluster, after port and subset overrides."""

    connection_pool: Any | None = None
    load_balancer: Any | None = None
    outlier_detection: Any | None = None
    tls: Any | None = None

    @property
    def is_passthrough_lb(self) -> bool:
        lb = self.load_balancer
        return lb is not None and lb.WhichOneof("lb_policy") == "simple" and lb.simple == _PASSTHROUGH


def _fields_for_port(policy: Any | None, port: int) -> dict[str, Any]:
    if policy is None:
        return {}
    out = {name: getattr(policy, name) for name in _FIELDS if policy.HasField(name)}
    for settings in policy.port_level_settings:
        if settings.port.number == port:
            out.update({name: getattr(settings, name) for name in _FIELDS if settings.HasField(name)})
            break
    return out


def cluster_policy(rule: MergedDestinationRule | None, subset: str, port: int) -> ClusterPolicy:
    """The rule's policy for ``port``, overridden field by field by the subset's."""
    if rule is None:
        return ClusterPolicy()
    fields = _fields_for_port(rule.traffic_policy, port)
    if subset:
        found = rule.subset(subset)
        if found is not None and found.HasField("traffic_policy"):
            fields.update(_fields_for_port(found.traffic_policy, port))
    return ClusterPolicy(**fields)


def default_circuit_breakers() -> Any:
    return circuit_breaker_pb2.CircuitBreakers(
        thresholds=[
            circuit_breaker_pb2.CircuitBreakers.Thresholds(
                max_connections=uint32(_MAX),
                max_pending_requests=uint32(_MAX),
                max_requests=uint32(_MAX),
                max_retries=uint32(_MAX),
                track_remaining=True,
            )
        ]
    )


def apply_connection_pool(cluster: Any, pool: Any | None, http_options: Any) -> None:
    """Circuit breakers, connect timeout and HTTP connection limits from ``connectionPool``."""
    cluster.circuit_breakers.CopyFrom(default_circuit_breakers())
    if pool is None:
        return
    thresholds = cluster.circuit_breakers.thresholds[0]
    if pool.HasField("tcp"):
        tcp = pool.tcp
        if tcp.max_connections > 0:
            thresholds.max_connections.value = tcp.max_connections
        if tcp.HasField("connect_timeout"):
            cluster.connect_timeout.CopyFrom(tcp.connect_timeout)
        if tcp.HasField("max_connection_duration"):
            http_options.common_http_protocol_options.max_connection_duration.CopyFrom(
                tcp.max_connection_duration
            )
    if pool.HasField("http"):
        http = pool.http
        if http.http1_max_pending_requests > 0:
            thresholds.max_pending_requests.value = http.http1_max_pending_requests
        if http.http2_max_requests > 0:
            thresholds.max_requests.value = http.http2_max_requests
        if http.max_retries > 0:
            thresholds.max_retries.value = http.max_retries
        if http.HasField("idle_timeout"):
            http_options.common_http_protocol_options.idle_timeout.CopyFrom(http.idle_timeout)
        if http.max_requests_per_connection > 0:
            http_options.common_http_protocol_options.max_requests_per_connection.value = (
                http.max_requests_per_connection
            )


def apply_load_balancer(cluster: Any, lb: Any | None) -> None:
    """lb_policy from ``loadBalancer``; LEAST_REQUEST when unset, as istiod defaults."""
    cluster.lb_policy = cluster_pb2.Cluster.LEAST_REQUEST
    if cluster.type == cluster_pb2.Cluster.ORIGINAL_DST:
        cluster.lb_policy = cluster_pb2.Cluster.CLUSTER_PROVIDED
        return
    if lb is None:
        return
    which = lb.WhichOneof("lb_policy")
    if which == "simple":
        cluster.lb_policy = {
            _ROUND_ROBIN: cluster_pb2.Cluster.ROUND_ROBIN,
            _RANDOM: cluster_pb2.Cluster.RANDOM,
            _LEAST_CONN: cluster_pb2.Cluster.LEAST_REQUEST,
            _LEAST_REQUEST: cluster_pb2.Cluster.LEAST_REQUEST,
        }.get(lb.simple, cluster_pb2.Cluster.LEAST_REQUEST)
    elif which == "consistent_hash":
        hashing = lb.consistent_hash
        if hashing.HasField("maglev"):
            cluster.lb_policy = cluster_pb2.Cluster.MAGLEV
            if hashing.maglev.table_size:
                cluster.maglev_lb_config.table_size.value = hashing.maglev.table_size
        else:
            cluster.lb_policy = cluster_pb2.Cluster.RING_HASH
            size = hashing.ring_hash.minimum_ring_size if hashing.HasField("ring_hash") else 0
            size = size or hashing.minimum_ring_size or 1024
            cluster.ring_hash_lb_config.minimum_ring_size.value = size


def apply_outlier_detection(cluster: Any, outlier: Any | None) -> None:
    if outlier is None:
        return
    out = outlier_detection_pb2.OutlierDetection(enforcing_success_rate=uint32(0))
    five_xx = outlier.consecutive_5xx_errors.value if outlier.HasField("consecutive_5xx_errors") else None
    if five_xx is None and outlier.consecutive_errors > 0:
        five_xx = outlier.consecutive_errors
    if five_xx is not None:
        out.consecutive_5xx.value = five_xx
        out.enforcing_consecutive_5xx.value = 100 if five_xx > 0 else 0
    if outlier.HasField("consecutive_gateway_errors"):
        value = outlier.consecutive_gateway_errors.value
        out.consecutive_gateway_failure.value = value
        out.enforcing_consecutive_gateway_failure.value = 100 if value > 0 else 0
    if outlier.HasField("interval"):
        out.interval.CopyFrom(outlier.interval)
    if outlier.HasField("base_ejection_time"):
        out.base_ejection_time.CopyFrom(outlier.base_ejection_time)
    if outlier.max_ejection_percent > 0:
        out.max_ejection_percent.value = outlier.max_ejection_percent
    if outlier.split_external_local_origin_errors:
        out.split_external_local_origin_errors = True
        if outlier.HasField("consecutive_local_origin_failures"):
            out.consecutive_local_origin_failure.value = outlier.consecutive_local_origin_failures.value
            out.enforcing_consecutive_local_origin_failure.value = 100
        out.enforcing_local_origin_success_rate.value = 0
    cluster.outlier_detection.CopyFrom(out)
    if outlier.min_health_percent >= 0:
        cluster.common_lb_config.healthy_panic_threshold.CopyFrom(
            percent_pb2.Percent(value=float(outlier.min_health_percent))
        )


def http_protocol_options_for(protocol_http2: bool, sniffed: bool) -> Any:
    """HttpProtocolOptions for a cluster, or None when Envoy's defaults apply."""
    options = hpo.HttpProtocolOptions()
    if protocol_http2:
        options.explicit_http_config.http2_protocol_options.CopyFrom(protocol_pb2.Http2ProtocolOptions())
    elif sniffed:
        options.use_downstream_protocol_config.http_protocol_options.CopyFrom(
            protocol_pb2.Http1ProtocolOptions()
        )
        options.use_downstream_protocol_config.http2_protocol_options.CopyFrom(
            protocol_pb2.Http2ProtocolOptions()
        )
    return options
