"""MeshConfig, checked as istiod 1.28 checks it once the defaults are merged in.

Extension providers are not checked: istiod only logs their problems.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from meshpilot._proto.istio.mesh.v1alpha1 import proxy_pb2
from meshpilot.config.errors import ValidationError
from meshpilot.config.validation import goparse, hosts
from meshpilot.config.validation.formatting import enum_name, go_duration, go_list, go_quote
from meshpilot.config.validation.quantities import duration_nanos, validate_duration
from meshpilot.config.validation.report import Report
from meshpilot.config.validation.tls import client_tls_errors
from meshpilot.config.validation.traffic_policy import check_locality_lb_setting

_MS = 1_000_000
_HOUR = 3600 * 1_000_000_000
_ECDH_CURVES = frozenset(
    {"P-224", "P-256", "P-521", "P-384", "X25519", "X25519Kyber768Draft00", "X25519MLKEM768"}
)
_AUTH_POLICIES = (proxy_pb2.AuthenticationPolicy.NONE, proxy_pb2.AuthenticationPolicy.MUTUAL_TLS)


def _prefixed(prefix: str, messages: Iterable[str]) -> list[str]:
    return [f"{prefix} {m}" for m in messages]


def _connect_timeout_error(timeout: Any) -> str | None:
    problem = validate_duration(timeout)
    if problem:
        return problem
    nanos = duration_nanos(timeout)
    if not _MS <= nanos <= _HOUR:
        return f"time {go_duration(nanos)} must be >{go_duration(_MS)} and <{go_duration(_HOUR)}"
    return None


def _protocol_detection_timeout_error(timeout: Any) -> str | None:
    # 0 turns protocol detection's timeout off.
    nanos = duration_nanos(timeout)
    if nanos != 0 and nanos % _MS:
        return "only durations to ms precision are supported"
    return None


def proxy_address_error(address: str) -> str | None:
    """A ``host:port`` address whose host is a hostname or an IP."""
    try:
        host, port_text = goparse.split_host_port(address)
    except goparse.GoParseError as err:
        return f"unable to split {go_quote(address)}: {err}"
    try:
        port = goparse.atoi(port_text)
    except goparse.GoParseError as err:
        return f"port ({port_text}) is not a number: {err}"
    problem = hosts.validate_port(port)
    if problem:
        return problem
    if hosts.validate_fqdn(host) and not hosts.is_ip_address(host):
        return f"{go_quote(host)} is not a valid hostname or an IP address"
    return None


def _drain_duration_errors(drain: Any) -> list[str]:
    problem = validate_duration(drain)
    if problem:
        return [f"invalid drain duration: {problem}"]
    if duration_nanos(drain) % 1_000_000_000:
        return ["drain time only supports durations to seconds precision"]
    return []


def _tracing_errors(tracing: Any) -> list[str]:
    errors = []
    tracer = tracing.WhichOneof("tracer")
    if tracer == "lightstep":
        lightstep = tracing.lightstep
        found = []
        if not lightstep.address:
            found.append("address is required")
        problem = proxy_address_error(lightstep.address)
        if problem:
            found.append(f"invalid lightstep address: {problem}")
        if not lightstep.access_token:
            found.append("access token is required")
        errors.extend(_prefixed("invalid lightstep config:", found))
    elif tracer in ("zipkin", "datadog"):
        # $(HOST_IP) is filled in by the proxy at startup.
        address = getattr(tracing, tracer).address.replace("$(HOST_IP)", "127.0.0.1", 1)
        problem = proxy_address_error(address)
        if problem:
            errors.append(f"invalid {tracer} config: {problem}")
    if tracing.HasField("tls_settings"):
        errors.extend(_prefixed("invalid tracing TLS config:", client_tls_errors("", tracing.tls_settings)))
    return errors


def _private_key_provider_errors(provider: Any) -> list[str]:
    kind = provider.WhichOneof("provider")
    if kind is None:
        return ["private key provider configuration is required", "unknown private key provider"]
    settings = getattr(provider, kind)
    if not settings.HasField("poll_delay"):
        return ["pollDelay is required"]
    if duration_nanos(settings.poll_delay) == 0:
        return ["pollDelay must be non zero"]
    return []


def _proxy_config_errors(proxy: Any, report: Report) -> None:
    errors: list[str] = []
    if not proxy.config_path:
        errors.append("config path must be set")
    if not proxy.binary_path:
        errors.append("binary path must be set")
    naming = proxy.WhichOneof("cluster_name")
    if naming == "service_cluster" and not proxy.service_cluster:
        errors.append("service cluster must be specified")
    elif naming is None:
        errors.append("oneof service cluster or tracing service name must be specified")
    errors.extend(_drain_duration_errors(proxy.drain_duration))
    if not proxy.discovery_address:
        errors.append("discovery address must be set to the proxy discovery service")
    else:
        problem = proxy_address_error(proxy.discovery_address)
        if problem:
            errors.append(f"invalid discovery address: {problem}")
    if proxy.HasField("tracing"):
        errors.extend(_tracing_errors(proxy.tracing))
    for what, address in (
        ("statsd udp", proxy.statsd_udp_address),
        ("envoy metrics service", proxy.envoy_metrics_service_address),
        ("envoy metrics service", proxy.envoy_metrics_service.address),
        ("envoy access log service", proxy.envoy_access_log_service.address),
    ):
        problem = proxy_address_error(address) if address else None
        if problem:
            errors.append(f"invalid {what} address {go_quote(address)}: {problem}")
    if "ISTIO_META_DNS_AUTO_ALLOCATE" in proxy.proxy_metadata:
        report.warn(
            "'ISTIO_META_DNS_AUTO_ALLOCATE' is deprecated; review "
            "https://istio.io/latest/docs/ops/configuration/traffic-management/dns-proxy/"
            "#dns-auto-allocation-v2 for information about replacement functionality"
        )
    problem = hosts.validate_port(proxy.proxy_admin_port)
    if problem:
        errors.append(f"invalid proxy admin port: {problem}")
    if proxy.control_plane_auth_policy not in _AUTH_POLICIES:
        policy = go_quote(enum_name(proxy, "control_plane_auth_policy"))
        errors.append(f"invalid authentication policy: unrecognized control plane auth policy {policy}")
    problem = hosts.validate_port(proxy.status_port)
    if problem:
        errors.append(f"invalid status port: {problem}")
    if proxy.HasField("private_key_provider"):
        errors.extend(
            _prefixed(
                "invalid private key provider configuration:",
                _private_key_provider_errors(proxy.private_key_provider),
            )
        )
    report.errors.extend(errors)


def _trust_domain_error(domain: str) -> str | None:
    if not domain:
        return "empty domain name not allowed"
    labels = domain.split(".")
    for i, label in enumerate(labels):
        if i == len(labels) - 1 and label == "":
            return None
        if not hosts.is_dns1123_label(label):
            return f"trust domain name {go_quote(domain)} invalid"
    return None


def _check_tls_settings(mesh: Any, report: Report) -> None:
    if mesh.HasField("mesh_mTLS") and mesh.mesh_mTLS.ecdh_curves:
        report.error("mesh TLS does not support ECDH curves configuration")
    unknown: set[str] = set()
    seen: set[str] = set()
    duplicates: set[str] = set()
    for curve in mesh.tls_defaults.ecdh_curves:
        if curve and curve not in _ECDH_CURVES:
            unknown.add(curve)
        elif curve in seen:
            duplicates.add(curve)
        else:
            seen.add(curve)
    if unknown:
        report.warn(f"detected unrecognized ECDH curves: {go_list(sorted(unknown))}")
    if duplicates:
        report.warn(f"detected duplicate ECDH curves: {go_list(sorted(duplicates))}")


def validate_mesh_config(mesh: Any) -> list[str]:
    """Check a MeshConfig; errors raise ValidationError, and the warnings are returned."""
    report = Report()
    problem = hosts.validate_port(mesh.proxy_listen_port)
    if problem:
        report.error(f"invalid proxy listen port: {problem}")
    problem = _connect_timeout_error(mesh.connect_timeout)
    if problem:
        report.error(f"invalid connect timeout: {problem}")
    problem = _protocol_detection_timeout_error(mesh.protocol_detection_timeout)
    if problem:
        report.error(f"invalid protocol detection timeout: {problem}")
    if not mesh.HasField("default_config"):
        report.error("missing default config")
    else:
        _proxy_config_errors(mesh.default_config, report)
    if mesh.HasField("locality_lb_setting"):
        # The mesh-wide setting has no outlier detection of its own to require.
        check_locality_lb_setting(mesh.locality_lb_setting, True, report)
    for index, settings in enumerate(mesh.service_settings):
        for host in settings.hosts:
            problem = hosts.validate_wildcard_domain(host)
            if problem:
                report.error(f"serviceSettings[{index}], host `{host}`: {problem}")
    problem = _trust_domain_error(mesh.trust_domain)
    if problem:
        report.error(f"trustDomain: {problem}")
    for index, alias in enumerate(mesh.trust_domain_aliases):
        problem = _trust_domain_error(alias)
        if problem:
            report.error(f"trustDomainAliases[{index}], domain `{alias}` : {problem}")
    _check_tls_settings(mesh, report)
    if report.errors:
        raise ValidationError(report.errors)
    return report.warnings
