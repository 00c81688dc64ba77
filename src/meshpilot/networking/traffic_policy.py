"""DestinationRule traffic policies applied to clusters, as istiod applies them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from envoy.config.cluster.v3 import circuit_breaker_pb2, cluster_pb2, outlier_detection_pb2
from envoy.config.core.v3 import protocol_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2 as hpo
from envoy.type.v3 import percent_pb2

from meshpilot.model.destination_rules import MergedDestinationRule
from meshpilot.model.protocol import Protocol
from meshpilot.networking.protobuf import uint32

_MAX = 0xFFFFFFFF
# LoadBalancerSettings.SimpleLB numbers.
_LEAST_CONN, _RANDOM, _PASSTHROUGH, _ROUND_ROBIN, _LEAST_REQUEST = 1, 2, 3, 4, 5
_FIELDS = ("connection_pool", "load_balancer", "outlier_detection", "tls")
# ConnectionPoolSettings.HTTPSettings.H2UpgradePolicy and MeshConfig.H2UpgradePolicy numbers.
_UPGRADE, _DO_NOT_UPGRADE = 2, 1
_MESH_UPGRADE = 1


@dataclass(frozen=True, slots=True)
class ClusterPolicy:
    """The traffic policy that applies to one cluster, after port and subset overrides."""

    connection_pool: Any | None = None
    load_balancer: Any | None = None
    outlier_detection: Any | None = None
    tls: Any | None = None
    proxy_protocol: Any | None = None

    @property
    def is_passthrough_lb(self) -> bool:
        lb = self.load_balancer
        return lb is not None and lb.WhichOneof("lb_policy") == "simple" and lb.simple == _PASSTHROUGH

    _fingerprint: tuple[bytes | None, ...] | None = field(default=None, init=False, compare=False, repr=False)

    @property
    def fingerprint(self) -> tuple[bytes | None, ...]:
        """The policy as bytes: equal for equal policies, whichever rule, subset or port they came from."""
        if self._fingerprint is None:
            parts = (*(getattr(self, name) for name in _FIELDS), self.proxy_protocol)
            found = tuple(None if p is None else p.SerializeToString(deterministic=True) for p in parts)
            object.__setattr__(self, "_fingerprint", found)  # a cache on a frozen object
            return found
        return self._fingerprint


_NO_POLICY = ClusterPolicy()


def _fields_for_port(policy: Any | None, port: int) -> tuple[dict[str, Any], bool]:
    """The policy's fields for ``port``, and whether a port-level setting matched.

    A matching port-level setting replaces all four fields: what it leaves out
    falls back to defaults, not to the enclosing policy (istiod's
    GetPortLevelTrafficPolicy); nor is ``proxyProtocol`` kept then.
    """
    if policy is None:
        return {}, False
    for settings in policy.port_level_settings:
        if settings.port.number == port:
            return {name: getattr(settings, name) for name in _FIELDS if settings.HasField(name)}, True
    out = {name: getattr(policy, name) for name in _FIELDS if policy.HasField(name)}
    if policy.HasField("proxy_protocol"):
        out["proxy_protocol"] = policy.proxy_protocol
    return out, False


def cluster_policy(rule: MergedDestinationRule | None, subset: str, port: int) -> ClusterPolicy:
    """The rule's policy for ``port`` merged with the subset's, as istiod's MergeSubsetTrafficPolicy.

    Subset fields override the rule's one by one; a subset port-level setting
    overrides all four, set or not.
    """
    if rule is None:
        return _NO_POLICY
    key = ("cluster_policy", subset, port)
    found: ClusterPolicy | None = rule.derived.get(key)
    if found is None:
        found = rule.derived[key] = _merged_policy(rule, subset, port)
    return found


def _merged_policy(rule: MergedDestinationRule, subset: str, port: int) -> ClusterPolicy:
    fields, _ = _fields_for_port(rule.traffic_policy, port)
    if subset:
        found = rule.subset(subset)
        if found is not None and found.HasField("traffic_policy"):
            subset_fields, port_level = _fields_for_port(found.traffic_policy, port)
            if port_level:
                for name in _FIELDS:
                    fields[name] = subset_fields.get(name)
            else:
                fields.update(subset_fields)
    return ClusterPolicy(**{name: value for name, value in fields.items() if value is not None})


def default_circuit_breakers() -> Any:
    return circuit_breaker_pb2.CircuitBreakers(
        thresholds=[
            circuit_breaker_pb2.CircuitBreakers.Thresholds(
                max_connections=uint32(_MAX),
                max_pending_requests=uint32(_MAX),
                max_requests=uint32(_MAX),
                max_retries=uint32(_MAX),
                # No track_remaining: istiod leaves Envoy's remaining_* gauges off
                # (DISABLE_TRACK_REMAINING_CB_METRICS, on by default).
            )
        ]
    )


def apply_connection_pool(cluster: Any, pool: Any | None, http_options: Any, mesh: Any) -> None:
    """Circuit breakers, timeouts, keepalive and HTTP connection limits from ``connectionPool``.

    Zero means "not set" for the numeric limits, as in istiod (proto3 cannot tell them apart).
    """
    cluster.circuit_breakers.CopyFrom(default_circuit_breakers())
    thresholds = cluster.circuit_breakers.thresholds[0]
    idle_timeout = None
    max_connection_duration = None
    http = pool.http if pool is not None and pool.HasField("http") else None
    tcp = pool.tcp if pool is not None and pool.HasField("tcp") else None
    if http is not None:
        if http.http2_max_requests > 0:
            thresholds.max_requests.value = http.http2_max_requests
        if http.http1_max_pending_requests > 0:
            thresholds.max_pending_requests.value = http.http1_max_pending_requests
        if http.max_retries > 0:
            thresholds.max_retries.value = http.max_retries
        if http.HasField("idle_timeout"):
            idle_timeout = http.idle_timeout
    if tcp is not None:
        if tcp.HasField("connect_timeout"):
            cluster.connect_timeout.CopyFrom(tcp.connect_timeout)
        if tcp.max_connections > 0:
            thresholds.max_connections.value = tcp.max_connections
        if tcp.HasField("max_connection_duration"):
            max_connection_duration = tcp.max_connection_duration
        if idle_timeout is None and tcp.HasField("idle_timeout"):
            idle_timeout = tcp.idle_timeout
    _apply_tcp_keepalive(cluster, mesh, tcp)
    common = http_options.common_http_protocol_options
    if idle_timeout is not None:
        common.idle_timeout.CopyFrom(idle_timeout)
    if http is not None and http.max_requests_per_connection > 0:
        common.max_requests_per_connection.value = http.max_requests_per_connection
    if max_connection_duration is not None:
        common.max_connection_duration.CopyFrom(max_connection_duration)
    if http is not None and http.max_concurrent_streams > 0:
        explicit = http_options.explicit_http_config
        if http_options.HasField("explicit_http_config") and explicit.HasField("http2_protocol_options"):
            explicit.http2_protocol_options.max_concurrent_streams.value = http.max_concurrent_streams
    if http is not None and http.use_client_protocol:
        _use_downstream_protocol(http_options)


def _use_downstream_protocol(http_options: Any) -> None:
    """HTTP/1.1 upstream for HTTP/1.1 callers, HTTP/2 for HTTP/2 callers."""
    downstream = hpo.HttpProtocolOptions.UseDownstreamHttpConfig(
        http_protocol_options=protocol_pb2.Http1ProtocolOptions(),
        http2_protocol_options=protocol_pb2.Http2ProtocolOptions(),
    )
    http_options.use_downstream_protocol_config.CopyFrom(downstream)


def _apply_tcp_keepalive(cluster: Any, mesh: Any, tcp: Any | None) -> None:
    """The mesh's TCP keepalive, then the rule's attributes over it (istiod's applyTCPKeepalive)."""
    for keepalive in (
        mesh.tcp_keepalive if mesh.HasField("tcp_keepalive") else None,
        tcp.tcp_keepalive if tcp is not None and tcp.HasField("tcp_keepalive") else None,
    ):
        if keepalive is None:
            continue
        # An empty TcpKeepalive still turns SO_KEEPALIVE on, with the OS's timings.
        out = cluster.upstream_connection_options.tcp_keepalive
        out.SetInParent()
        if keepalive.probes > 0:
            out.keepalive_probes.value = keepalive.probes
        if keepalive.HasField("time"):
            out.keepalive_time.value = keepalive.time.seconds
        if keepalive.HasField("interval"):
            out.keepalive_interval.value = keepalive.interval.seconds


def should_h2_upgrade(pool: Any | None, protocol: Protocol, mesh: Any) -> bool:
    """Whether an outbound cluster upgrades to HTTP/2 upstream (istiod's shouldH2Upgrade).

    The rule's ``h2UpgradePolicy`` decides when set (``useClientProtocol`` vetoes);
    else the mesh's policy, for HTTP ports only (sniffed ports keep the caller's protocol).
    """
    if pool is not None and pool.HasField("http"):
        http = pool.http
        if http.use_client_protocol:
            return False
        if http.h2_upgrade_policy == _UPGRADE:
            return True
        if http.h2_upgrade_policy == _DO_NOT_UPGRADE:
            return False
    if not protocol.is_http:
        return False
    return bool(mesh.h2_upgrade_policy == _MESH_UPGRADE)


def set_h2(http_options: Any) -> None:
    http_options.explicit_http_config.http2_protocol_options.SetInParent()


def apply_load_balancer(
    cluster: Any, lb: Any | None, setting: Any | None = None, force_failover: bool = False
) -> None:
    """lb_policy and its config from ``loadBalancer``; LEAST_REQUEST when unset, as istiod defaults.

    ``setting`` is the locality setting in force (the rule's, else the mesh's);
    locality weights need Envoy's locality-weighted load balancing turned on.
    """
    _apply_locality_config(cluster, setting, force_failover)
    if cluster.type == cluster_pb2.Cluster.ORIGINAL_DST:
        cluster.lb_policy = cluster_pb2.Cluster.CLUSTER_PROVIDED
        return
    simple = lb.simple if lb is not None and lb.WhichOneof("lb_policy") == "simple" else None
    if simple == _RANDOM:
        cluster.lb_policy = cluster_pb2.Cluster.RANDOM
    elif simple == _ROUND_ROBIN:
        cluster.lb_policy = cluster_pb2.Cluster.ROUND_ROBIN
        slow_start = _slow_start(lb)
        if slow_start is not None:
            cluster.round_robin_lb_config.slow_start_config.CopyFrom(slow_start)
    elif simple == _PASSTHROUGH:
        cluster.lb_policy = cluster_pb2.Cluster.CLUSTER_PROVIDED
        cluster.type = cluster_pb2.Cluster.ORIGINAL_DST
        cluster.ClearField("load_assignment")
    else:
        # LEAST_REQUEST, deprecated LEAST_CONN and unset all mean least request.
        cluster.lb_policy = cluster_pb2.Cluster.LEAST_REQUEST
        slow_start = _slow_start(lb)
        if slow_start is not None:
            cluster.least_request_lb_config.slow_start_config.CopyFrom(slow_start)
    if lb is not None and lb.HasField("consistent_hash"):
        _apply_consistent_hash(cluster, lb.consistent_hash)


def _apply_locality_config(cluster: Any, setting: Any | None, force_failover: bool) -> None:
    """Locality-weighted load balancing when weights or explicit failover are in play.

    Not otherwise: it changes how other policies (least request) pick hosts.
    Failover counts only with outlier detection, which must be applied first.
    """
    if setting is None:
        return
    enabled = force_failover or cluster.HasField("outlier_detection")
    failover = enabled and bool(setting.failover or setting.failover_priority)
    if failover or setting.distribute:
        cluster.common_lb_config.locality_weighted_lb_config.SetInParent()


def _slow_start(lb: Any | None) -> Any | None:
    """slow_start_config from ``warmup``, else the deprecated ``warmupDurationSecs``."""
    if lb is None:
        return None
    if lb.HasField("warmup"):
        warmup = lb.warmup
        config = cluster_pb2.Cluster.SlowStartConfig()
        if warmup.HasField("duration"):
            config.slow_start_window.CopyFrom(warmup.duration)
        # Linear ramp-up and Envoy's 10% floor unless set; the runtime key is a fixed placeholder.
        config.aggression.default_value = warmup.aggression.value if warmup.HasField("aggression") else 1.0
        config.aggression.runtime_key = "("
        minimum = warmup.minimum_percent.value if warmup.HasField("minimum_percent") else 10.0
        config.min_weight_percent.value = minimum
        return config
    if lb.HasField("warmup_duration_secs"):
        return cluster_pb2.Cluster.SlowStartConfig(slow_start_window=lb.warmup_duration_secs)
    return None


def _apply_consistent_hash(cluster: Any, hashing: Any) -> None:
    """RING_HASH or MAGLEV; sizes only when given, except the deprecated form defaults to 1024."""
    if hashing.HasField("maglev"):
        cluster.lb_policy = cluster_pb2.Cluster.MAGLEV
        if hashing.maglev.table_size:
            cluster.maglev_lb_config.table_size.value = hashing.maglev.table_size
    elif hashing.HasField("ring_hash"):
        cluster.lb_policy = cluster_pb2.Cluster.RING_HASH
        if hashing.ring_hash.minimum_ring_size:
            cluster.ring_hash_lb_config.minimum_ring_size.value = hashing.ring_hash.minimum_ring_size
    else:
        cluster.lb_policy = cluster_pb2.Cluster.RING_HASH
        cluster.ring_hash_lb_config.minimum_ring_size.value = hashing.minimum_ring_size or 1024


def apply_outlier_detection(cluster: Any, outlier: Any | None) -> None:
    if outlier is None:
        return
    out = outlier_detection_pb2.OutlierDetection(enforcing_success_rate=uint32(0))
    # Success-rate ejection stays off; zero thresholds are written but not enforced.
    if outlier.HasField("consecutive_5xx_errors"):
        five_xx = outlier.consecutive_5xx_errors.value
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
        if outlier.consecutive_local_origin_failures.value > 0:
            out.consecutive_local_origin_failure.value = outlier.consecutive_local_origin_failures.value
            out.enforcing_consecutive_local_origin_failure.value = 100
        out.enforcing_local_origin_success_rate.value = 0
    cluster.outlier_detection.CopyFrom(out)
    # Panic mode off by default (minHealthPercent 0): few pods per service make it misfire.
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
