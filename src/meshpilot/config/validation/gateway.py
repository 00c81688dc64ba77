"""Gateway (networking.istio.io)."""

from __future__ import annotations

from typing import Any

from meshpilot._proto.istio.networking.v1alpha3 import gateway_pb2
from meshpilot.config.validation import hosts
from meshpilot.config.validation.formatting import go_quote, proto_text
from meshpilot.config.validation.registry import register
from meshpilot.config.validation.report import Report
from meshpilot.config.validation.tls import check_server_tls
from meshpilot.model.config import Config
from meshpilot.model.kind import Kind

GATEWAY_SEMANTICS_ANNOTATION = "internal.istio.io/gateway-semantics"
_PASSTHROUGH_MODES = (
    gateway_pb2.ServerTLSSettings.PASSTHROUGH,
    gateway_pb2.ServerTLSSettings.AUTO_PASSTHROUGH,
)


def _port_errors(port: Any, bind: str) -> list[str]:
    errors: list[str | None] = []
    if hosts.parse_protocol(port.protocol) == hosts.UNSUPPORTED_PROTOCOL:
        errors.append(
            f"invalid protocol {go_quote(port.protocol)}, supported protocols are "
            "HTTP, HTTP2, GRPC, GRPC-WEB, MONGO, REDIS, MYSQL, TCP"
        )
    # Port 0 is how a server listening on a unix socket says "no port".
    if port.number > 0 or hosts.unix_address(bind) is None:
        errors.append(hosts.validate_port(port.number))
    if port.target_port > 0:
        errors.append("targetPort has no impact on Gateways")
    if not port.name:
        errors.append(f"port name must be set: {proto_text(port)}")
    return [e for e in errors if e is not None]


def _bind_errors(server: Any) -> list[str]:
    bind = server.bind
    path = hosts.unix_address(bind)
    if path is not None:
        errors = [hosts.validate_unix_address(path)]
        if server.HasField("port") and server.port.number != 0:
            errors.append(f"port number must be 0 for unix domain socket: {proto_text(server.port)}")
        return [e for e in errors if e is not None]
    if bind:
        problem = hosts.validate_ip_address(bind)
        return [problem] if problem else []
    return []


def _check_server(server: Any, gateway_semantics: bool, report: Report) -> None:
    if not server.hosts:
        report.error("server config must contain at least one host")
    for host in server.hosts:
        report.errors.extend(
            hosts.namespace_slash_host_errors(host, is_gateway=True, gateway_semantics=gateway_semantics)
        )
    port_errors = _port_errors(server.port, server.bind) if server.HasField("port") else ["port is required"]
    report.errors.extend(port_errors)
    report.errors.extend(_bind_errors(server))
    has_tls = server.HasField("tls")
    if has_tls:
        check_server_tls(server.tls, report)
    if port_errors:
        return
    protocol = hosts.parse_protocol(server.port.protocol)
    if hosts.is_tls_protocol(protocol):
        if not has_tls:
            report.error("server must have TLS settings for HTTPS/TLS protocols")
        return
    if not has_tls:
        return
    if hosts.is_http_protocol(protocol):
        tls = server.tls
        # Only an HTTPS redirect makes sense on a plain-text HTTP port; the
        # default mode (PASSTHROUGH) with no certificates is how that looks.
        if (
            tls.mode not in _PASSTHROUGH_MODES
            or tls.ca_certificates
            or tls.private_key
            or tls.server_certificate
        ):
            report.error("server cannot have TLS settings for plain text HTTP ports")
    else:
        report.error("server cannot have TLS settings for non HTTPS/TLS ports")


@register(Kind.GATEWAY)
def validate_gateway(config: Config, report: Report) -> None:
    """A Gateway: its name, servers, hosts, ports and TLS settings."""
    gateway = config.spec
    # Gateways generated from the Gateway API get some leeway.
    gateway_semantics = config.meta.annotations.get(GATEWAY_SEMANTICS_ANNOTATION) == "gateway"
    # The name ends up in generated names (route names, SDS resources) that cannot contain dots.
    if not hosts.is_dns1123_label(config.meta.name) and not gateway_semantics:
        report.error(f"invalid gateway name: {go_quote(config.meta.name)}")
    if not gateway.servers:
        report.error("gateway must have at least one server")
    for server in gateway.servers:
        _check_server(server, gateway_semantics, report)
    port_names: set[str] = set()
    for server in gateway.servers:
        if not server.HasField("port"):
            continue
        name = server.port.name
        if name in port_names:
            report.error(f"port names in servers must be unique: duplicate name {name}")
        port_names.add(name)
        protocol = hosts.parse_protocol(server.port.protocol)
        if not hosts.is_http_protocol(protocol) and server.tls.https_redirect:
            report.warn("tls.httpsRedirect should only be used with http servers")
