"""DestinationRule traffic policies, and the parts of them Sidecar and MeshConfig reuse."""

from __future__ import annotations

import math
from typing import Any

from meshpilot._proto.istio.networking.v1alpha3 import destination_rule_pb2
from meshpilot.config.validation import hosts
from meshpilot.config.validation.quantities import duration_nanos, validate_duration, validate_percent
from meshpilot.config.validation.report import Report
from meshpilot.config.validation.tls import client_tls_errors

_UPGRADE = destination_rule_pb2.ConnectionPoolSettings.HTTPSettings.UPGRADE
_TOPOLOGY_LABELS = (
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "topology.istio.io/subzone",
)
_MAGLEV_MAX_TABLE = 5000011


def check_outlier_detection(od: Any, report: Report) -> None:
    """Durations, percentages, and the local-origin failure setting that needs split errors."""
    if od.HasField("base_ejection_time"):
        report.check(validate_duration(od.base_ejection_time))
    if od.consecutive_errors != 0:
        report.warn(
            "outlier detection consecutive errors is deprecated, use consecutiveGatewayErrors or "
            "consecutive5xxErrors instead"
        )
    if not od.split_external_local_origin_errors and od.consecutive_local_origin_failures.value > 0:
        report.error(
            "outlier detection consecutive local origin failures is specified, but split external local "
            "origin errors is set to false"
        )
    if od.HasField("interval"):
        report.check(validate_duration(od.interval))
    report.check(validate_percent(od.max_ejection_percent))
    report.check(validate_percent(od.min_health_percent))


def connection_pool_errors(cp: Any) -> list[str]:
    """A ConnectionPoolSettings (DestinationRule, Sidecar ingress and inbound pools)."""
    if not cp.HasField("http") and not cp.HasField("tcp"):
        return ["connection pool must have at least one field"]
    errors: list[str | None] = []
    if cp.HasField("http"):
        http = cp.http
        for value, what in (
            (http.http1_max_pending_requests, "http1 max pending requests"),
            (http.http2_max_requests, "http2 max requests"),
            (http.max_requests_per_connection, "max requests per connection"),
            (http.max_retries, "max retries"),
        ):
            if value < 0:
                errors.append(f"{what} must be non-negative")
        if http.HasField("idle_timeout"):
            errors.append(validate_duration(http.idle_timeout))
        if http.h2_upgrade_policy == _UPGRADE and http.use_client_protocol:
            errors.append("use client protocol must not be true when H2UpgradePolicy is UPGRADE")
        if http.max_concurrent_streams < 0:
            errors.append("max concurrent streams must be non-negative")
        # istiod 1.28 does not check http2KeepAlive yet.
    if cp.HasField("tcp"):
        tcp = cp.tcp
        if tcp.max_connections < 0:
            errors.append("max connections must be non-negative")
        if tcp.HasField("connect_timeout"):
            errors.append(validate_duration(tcp.connect_timeout))
        if tcp.HasField("max_connection_duration"):
            errors.append(validate_duration(tcp.max_connection_duration))
        # An idle timeout of 0 (under 1ms either way) turns the timeout off, and is allowed.
        if tcp.HasField("idle_timeout") and abs(duration_nanos(tcp.idle_timeout)) // 1_000_000 != 0:
            errors.append(validate_duration(tcp.idle_timeout))
        if tcp.HasField("tcp_keepalive"):
            keepalive = tcp.tcp_keepalive
            if keepalive.HasField("time"):
                errors.append(validate_duration(keepalive.time))
            if keepalive.HasField("interval"):
                errors.append(validate_duration(keepalive.interval))
    return [e for e in errors if e is not None]


def _is_prime(x: int) -> bool:
    """Envoy's primality test for Maglev table sizes (1 counts as prime there)."""
    if 0 < x < 4:
        return True
    if x % 2 == 0:
        return False
    return all(x % factor for factor in range(3, math.isqrt(x) + 1, 2))


def _check_consistent_hash(ch: Any, report: Report) -> None:
    if ch.WhichOneof("hash_key") == "http_cookie":
        cookie = ch.http_cookie
        if not cookie.name:
            report.error("name required for HttpCookie")
        names: set[str] = set()
        for attribute in cookie.attributes:
            if not attribute.name:
                report.error("cookie attribute name cannot be empty")
            elif attribute.name in names:
                report.error(f"duplicate cookie attribute name: {attribute.name}")
            else:
                names.add(attribute.name)
    if ch.minimum_ring_size != 0:
        report.warn(
            "consistent hash MinimumRingSize is deprecated, "
            "use ConsistentHashLB's RingHash configuration instead"
        )
        if ch.WhichOneof("hash_algorithm") is not None:
            report.error("only one of MinimumRingSize or Maglev/Ringhash can be specified")
    if ch.WhichOneof("hash_algorithm") == "maglev":
        size = ch.maglev.table_size
        if size == 0:
            report.error("tableSize must be set for maglev")
        if size >= _MAGLEV_MAX_TABLE:
            report.error(f"tableSize must be less than {_MAGLEV_MAX_TABLE} for maglev")
        if not _is_prime(size):
            report.error("tableSize must be a prime number for maglev")


def _locality_parts(locality: str) -> list[str] | None:
    parts = locality.split("/", 2)
    return None if "" in parts else parts


def _localities_error(localities: list[str]) -> str | None:
    """Each locality at most once, a single trailing ``*``, and no locality inside another."""
    # region -> zone -> set of subzones; "*" marks "all of them".
    tree: dict[str, dict[str, set[str]]] = {}
    for locality in localities:
        stars = locality.count("*")
        if stars and (stars > 1 or not locality.endswith("*")):
            return f"locality {locality} wildcard '*' number can not exceed 1 and must be in the end"
        overlap = f"locality {locality} overlap with previous specified ones"
        if "*" in tree:
            return overlap
        parts = _locality_parts(locality)
        if parts is None:
            return f"locality {locality} must not contain empty region/zone/subzone info"
        region = parts[0]
        if len(parts) == 1:
            if region in tree:
                return overlap
            tree[region] = {"*": {"*"}}
            continue
        zones = tree.get(region)
        zone = parts[1]
        if zones is None:
            tree[region] = {zone: {parts[2]} if len(parts) == 3 else {"*"}}
            continue
        if "*" in zones:
            return overlap
        if len(parts) == 2:
            if zone in zones:
                return overlap
            zones[zone] = {"*"}
            continue
        subzones = zones.get(zone)
        if subzones is None:
            zones[zone] = {parts[2]}
        elif "*" in subzones or parts[2] in subzones:
            return overlap
        else:
            subzones.add(parts[2])
    return None


def _locality_errors(lb: Any) -> str | None:
    """The checks of a LocalityLoadBalancerSetting that stop at the first problem."""
    if lb.distribute and lb.failover:
        return "can not simultaneously specify 'distribute' and 'failover'"
    if lb.failover and lb.failover_priority:
        for label in lb.failover_priority:
            if label in _TOPOLOGY_LABELS:
                return (
                    f"can not simultaneously set 'failover' and topology label '{label}' "
                    "in 'failover_priority'"
                )
    sources = []
    for distribute in lb.distribute:
        sources.append(getattr(distribute, "from"))
        targets = list(distribute.to.keys())
        weights = list(distribute.to.values())
        if any(not 1 <= weight <= 100 for weight in weights):
            return "locality weight must be in range [1, 100]"
        # istiod sums in a uint32, so the total wraps around like one.
        total = sum(weights) % 2**32
        if total != 100:
            return f"total locality weight {total} != 100"
        problem = _localities_error(targets)
        if problem:
            return problem
    return _localities_error(sources)


def check_locality_lb_setting(lb: Any, has_outlier: bool, report: Report) -> None:
    """A LocalityLoadBalancerSetting (DestinationRule and MeshConfig)."""
    problem = _locality_errors(lb)
    if problem:
        report.error(problem)
        return
    if (lb.failover or lb.failover_priority) and not has_outlier:
        report.warn("outlier detection policy must be provided for failover")
    for failover in lb.failover:
        source, target = getattr(failover, "from"), failover.to
        if source == target:
            report.error("locality lb failover settings must specify different regions")
        if "/" in source or "/" in target:
            report.error("locality lb failover only specify region")
        if "*" in source or "*" in target:
            report.error("locality lb failover region should not contain '*' wildcard")


def check_load_balancer(lb: Any, has_outlier: bool, report: Report) -> None:
    """A LoadBalancerSettings block. (istiod 1.28 does not check zoneAwareLbSetting.)"""
    if lb.WhichOneof("lb_policy") == "consistent_hash":
        _check_consistent_hash(lb.consistent_hash, report)
    if lb.HasField("locality_lb_setting"):
        check_locality_lb_setting(lb.locality_lb_setting, has_outlier, report)
    if lb.HasField("warmup"):
        warmup = lb.warmup
        if not warmup.HasField("duration"):
            report.error("duration is required")
        else:
            report.check(validate_duration(warmup.duration))
        if warmup.minimum_percent.value > 100:
            report.error("minimumPercent value should be less than or equal to 100")
        if warmup.HasField("aggression") and warmup.aggression.value < 1:
            report.error("aggression should be greater than or equal to 1")


def _tunnel_errors(tunnel: Any) -> list[str]:
    errors = []
    if tunnel.protocol not in ("", "CONNECT", "POST"):
        errors.append('tunnel protocol must be "CONNECT" or "POST"')
    fqdn_error = hosts.validate_fqdn(tunnel.target_host)
    ip_error = hosts.validate_ip_address(tunnel.target_host)
    if fqdn_error and ip_error:
        errors.append(f"tunnel target host must be valid FQDN or IP address: {fqdn_error}; {ip_error}")
    port_error = hosts.validate_port(tunnel.target_port)
    if port_error:
        errors.append(f"tunnel target port is invalid: {port_error}")
    return errors


def _port_level_errors(namespace: str, policy: Any) -> list[str]:
    errors = []
    if not policy.HasField("port"):
        errors.append("portTrafficPolicy must have valid port")
    parts = ("outlier_detection", "connection_pool", "load_balancer", "tls")
    if not any(policy.HasField(part) for part in parts):
        errors.append("port traffic policy must have at least one field")
        return errors
    # istiod drops the warnings of port-level settings.
    scratch = Report()
    _check_policy_parts(namespace, policy, scratch)
    errors.extend(scratch.errors)
    return errors


def _check_policy_parts(namespace: str, policy: Any, report: Report) -> None:
    """The parts a TrafficPolicy shares with its port-level settings."""
    if policy.HasField("outlier_detection"):
        check_outlier_detection(policy.outlier_detection, report)
    if policy.HasField("connection_pool"):
        report.errors.extend(connection_pool_errors(policy.connection_pool))
    if policy.HasField("load_balancer"):
        check_load_balancer(policy.load_balancer, policy.HasField("outlier_detection"), report)
    if policy.HasField("tls"):
        report.errors.extend(client_tls_errors(namespace, policy.tls))


_POLICY_FIELDS = (
    "outlier_detection",
    "connection_pool",
    "load_balancer",
    "tls",
    "tunnel",
    "proxy_protocol",
    "retry_budget",
)


def check_traffic_policy(namespace: str, policy: Any, report: Report) -> None:
    """A DestinationRule (or subset) TrafficPolicy."""
    if not policy.port_level_settings and not any(policy.HasField(f) for f in _POLICY_FIELDS):
        report.error("traffic policy must have at least one field")
        return
    if policy.HasField("tunnel") and policy.HasField("proxy_protocol"):
        report.error("tunnel and proxyProtocol must not be set together")
        return
    _check_policy_parts(namespace, policy, report)
    for port_policy in policy.port_level_settings:
        report.errors.extend(_port_level_errors(namespace, port_policy))
    if policy.HasField("tunnel"):
        report.errors.extend(_tunnel_errors(policy.tunnel))
    if policy.HasField("proxy_protocol") and policy.proxy_protocol.version not in (0, 1):
        report.error(f"proxy protocol version is invalid: {policy.proxy_protocol.version}")
