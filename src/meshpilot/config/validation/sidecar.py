"""Sidecar."""

from __future__ import annotations

from typing import Any

from meshpilot._proto.istio.networking.v1alpha3 import gateway_pb2, sidecar_pb2
from meshpilot.config.validation import goparse, hosts
from meshpilot.config.validation.formatting import enum_name, go_quote
from meshpilot.config.validation.registry import register
from meshpilot.config.validation.report import Report
from meshpilot.config.validation.route_parts import destination_errors
from meshpilot.config.validation.selectors import alpha_selector_check
from meshpilot.config.validation.tls import check_server_tls
from meshpilot.config.validation.traffic_policy import connection_pool_errors
from meshpilot.model.config import Config
from meshpilot.model.kind import Kind

_LOCAL_HOSTS = frozenset({"", "127.0.0.1", "0.0.0.0", "::1", "::"})
_UNSUPPORTED_INGRESS_TLS_MODES = (
    gateway_pb2.ServerTLSSettings.ISTIO_MUTUAL,
    gateway_pb2.ServerTLSSettings.AUTO_PASSTHROUGH,
)
_UDS_CAPTURE_MODES = (sidecar_pb2.DEFAULT, sidecar_pb2.NONE)


def _default_endpoint_errors(endpoint: str) -> list[str]:
    """Where inbound traffic is forwarded: a loopback/any address with a port, or a unix socket."""
    path = hosts.unix_address(endpoint)
    if path is not None:
        problem = hosts.validate_unix_address(path)
        return [problem] if problem else []
    errors: list[str | None] = []
    try:
        host, port_text = goparse.split_host_port(endpoint)
    except goparse.GoParseError as err:
        errors.append(str(err))
        host, port_text = "", ""
    if host not in _LOCAL_HOSTS:
        errors.append(
            "sidecar: defaultEndpoint must be of form 127.0.0.1:<port>,0.0.0.0:<port>,[::1]:port,[::]:port,"
            "unix://filepath or unset"
        )
    try:
        errors.append(hosts.validate_port(goparse.atoi(port_text)))
    except goparse.GoParseError as err:
        errors.append(f"sidecar: defaultEndpoint port ({port_text}) is not a number: {err}")
    return [e for e in errors if e is not None]


def _ingress_tls_errors(listener: Any) -> list[str]:
    tls = listener.tls
    errors = []
    if tls.subject_alt_names:
        errors.append("sidecar: subjectAltNames is not supported in ingress tls")
    if tls.https_redirect:
        errors.append("sidecar: httpsRedirect is not supported")
    if tls.credential_name:
        errors.append("sidecar: credentialName is not currently supported")
    if tls.credential_names:
        errors.append("sidecar: credentialNames is not currently supported")
    if tls.tls_certificates:
        errors.append("sidecar: tls_certificates is not currently supported")
    if tls.mode in _UNSUPPORTED_INGRESS_TLS_MODES:
        errors.append(
            f"configuration is invalid: cannot set mode to {enum_name(tls, 'mode')} in sidecar ingress tls"
        )
    if not hosts.is_tls_protocol(hosts.parse_protocol(listener.port.protocol)):
        errors.append("server cannot have TLS settings for non HTTPS/TLS ports")
    return errors


def _check_ingress(sidecar: Any, report: Report) -> None:
    port_numbers: set[int] = set()
    for listener in sidecar.ingress:
        if not listener.HasField("port"):
            report.error("sidecar: port is required for ingress listeners")
            continue
        port = listener.port
        if port.target_port > 0:
            report.error("targetPort has no impact on Sidecars")
        if port.name:
            report.check(hosts.validate_port_name(port.name))
        report.check(hosts.validate_protocol(port.protocol))
        report.check(hosts.validate_port(port.number))
        if listener.bind:
            report.check(hosts.validate_ip_address(listener.bind))
        if port.number in port_numbers:
            report.error("sidecar: ports on IP bound listeners must be unique")
        port_numbers.add(port.number)
        if listener.default_endpoint:
            report.errors.extend(_default_endpoint_errors(listener.default_endpoint))
        if listener.HasField("tls"):
            report.errors.extend(_ingress_tls_errors(listener))
            check_server_tls(listener.tls, report)
        if listener.HasField("connection_pool"):
            report.errors.extend(connection_pool_errors(listener.connection_pool))
            protocol = hosts.parse_protocol(port.protocol)
            if listener.connection_pool.HasField("http") and not hosts.is_http_protocol(protocol):
                report.warn(
                    f"sidecar: HTTP connection pool settings are configured for port {port.number} "
                    f"({go_quote(port.name)}) but its protocol is not HTTP ({port.protocol}); "
                    "only TCP settings will apply"
                )


def _check_egress_port(listener: Any, report: Report) -> None:
    port = listener.port
    if port.target_port > 0:
        report.error("targetPort has no impact on Sidecars")
    if port.name:
        report.check(hosts.validate_port_name(port.name))
    report.check(hosts.validate_protocol(port.protocol))
    if port.number == 0:
        # Port 0 means the listener is a unix domain socket.
        path = hosts.unix_address(listener.bind)
        if path is None:
            report.error("sidecar: ports with 0 value must have a unix domain socket bind address")
        else:
            report.check(hosts.validate_unix_address(path))
        if listener.capture_mode not in _UDS_CAPTURE_MODES:
            report.error("sidecar: captureMode must be DEFAULT/NONE for unix domain socket listeners")
    else:
        report.check(hosts.validate_port(port.number))
        if listener.bind:
            report.check(hosts.validate_ip_address(listener.bind))


def _check_egress_hosts(namespace: str, listener: Any, report: Report) -> None:
    if not listener.hosts:
        report.error("sidecar: egress listener must contain at least one host")
        return
    # namespace -> services already listed for it ("*" for all of them).
    listed: dict[str, set[str]] = {}
    for host in listener.hosts:
        ns, slash, service = host.partition("/")
        if slash:
            ns = namespace if ns == "." else ns
            services = listed.setdefault(ns, set())
            if service != "*":
                duplicate = service in services or "*" in services
            else:
                duplicate = bool(services)
            if duplicate:
                report.warn(f"duplicated egress host: {host}")
            services.add(service)
        report.errors.extend(
            hosts.namespace_slash_host_errors(host, is_gateway=False, gateway_semantics=False)
        )
    if "*" in listed.get("*", set()) and len(listed) != 1:
        report.warn("`*/*` host select all resources, no other hosts can be added")


def _check_egress(namespace: str, sidecar: Any, report: Report) -> None:
    port_numbers: set[int] = set()
    socket_binds: set[str] = set()
    catch_all_found = False
    last = len(sidecar.egress) - 1
    for index, listener in enumerate(sidecar.egress):
        if not listener.HasField("port"):
            # A listener without a port catches all remaining traffic, so it must come last.
            if catch_all_found:
                report.error("sidecar: egress can have only one listener with empty port")
                continue
            if index == last:
                catch_all_found = True
            else:
                report.error(
                    "sidecar: the egress listener with empty port should be the last listener in the list"
                )
        else:
            _check_egress_port(listener, report)
            if listener.port.number == 0:
                if listener.bind in socket_binds:
                    report.error("sidecar: unix domain socket values for listeners must be unique")
                socket_binds.add(listener.bind)
            else:
                if listener.port.number in port_numbers:
                    report.error("sidecar: ports on IP bound listeners must be unique")
                port_numbers.add(listener.port.number)
        _check_egress_hosts(namespace, listener, report)


def _outbound_policy_errors(policy: Any) -> list[str]:
    """(istiod 1.28 does not yet reject the mesh-only ALLOW_ANY_DYNAMIC_DNS mode here.)"""
    if not policy.HasField("egress_proxy"):
        return []
    if policy.mode != sidecar_pb2.OutboundTrafficPolicy.ALLOW_ANY:
        return ["sidecar: egress_proxy must be set only with ALLOW_ANY outbound_traffic_policy mode"]
    proxy = policy.egress_proxy
    errors: list[str] = []
    problem = hosts.validate_fqdn(proxy.host)
    if problem:
        errors.append(problem)
    if not proxy.HasField("port"):
        errors.append("sidecar: egress_proxy port must be non-nil")
        return errors
    errors.extend(destination_errors(proxy))
    return errors


@register(Kind.SIDECAR)
def validate_sidecar(config: Config, report: Report) -> None:
    """A Sidecar: selector, ingress and egress listeners, connection pools, outbound policy."""
    sidecar = config.spec
    selector_errors, selector_unlabelled = alpha_selector_check(sidecar, "workload_selector")
    if selector_errors:
        report.errors.extend(selector_errors)
        return
    if not (
        sidecar.egress
        or sidecar.ingress
        or sidecar.HasField("outbound_traffic_policy")
        or sidecar.HasField("inbound_connection_pool")
    ):
        # istiod reports only this, without the selector warning.
        report.error("sidecar: empty configuration provided")
        return
    if selector_unlabelled:
        report.warn(
            "sidecar: workload selector specified without labels, "
            "will be applied to all services in namespace"
        )
    _check_ingress(sidecar, report)
    if sidecar.HasField("inbound_connection_pool"):
        report.errors.extend(connection_pool_errors(sidecar.inbound_connection_pool))
    _check_egress(config.meta.namespace, sidecar, report)
    if sidecar.HasField("outbound_traffic_policy"):
        report.errors.extend(_outbound_policy_errors(sidecar.outbound_traffic_policy))
