"""VirtualService: hosts, gateways, and the TLS and TCP routes (HTTP routes are in http_route)."""

from __future__ import annotations

from typing import Any

from meshpilot.config.validation import hosts, matches
from meshpilot.config.validation.formatting import go_list, go_quote
from meshpilot.config.validation.http_route import check_http_route
from meshpilot.config.validation.registry import register
from meshpilot.config.validation.report import Report
from meshpilot.config.validation.route_parts import (
    check_gateway_names,
    check_total_weight,
    check_weighted_destination,
)
from meshpilot.config.validation.selectors import label_map_errors
from meshpilot.config.validation.visibility import export_to_errors
from meshpilot.config.validation.vs_analysis import warn_unreachable_rules
from meshpilot.model.config import Config
from meshpilot.model.kind import Kind

MESH_GATEWAY = "mesh"
ROUTE_SEMANTICS_ANNOTATION = "internal.istio.io/route-semantics"


def _has_sni_hosts(vs: Any) -> bool:
    return any(match.sni_hosts for tls in vs.tls for match in tls.match)


def _sni_host_check(sni: str, vs: Any, report: Report) -> None:
    # An empty gateway list counts as "bound to a gateway" here, unlike for the hosts.
    if MESH_GATEWAY not in vs.gateways:
        problem = hosts.validate_wildcard_domain_for_gateway_vs(True, sni)
    else:
        problem = hosts.validate_wildcard_domain(sni)
    if problem:
        if hosts.is_ip_address(sni):
            report.warn(
                f"using an IP address ({go_quote(sni)}) goes against SNI spec "
                "and most clients do not support this"
            )
        else:
            report.error(problem)
        return
    if not any(hosts.host_subset_of(sni, host) for host in vs.hosts):
        report.error(
            f"SNI host {go_quote(sni)} is not a compatible subset of any of the virtual service hosts: "
            f"[{', '.join(vs.hosts)}]"
        )


def _check_l4_match_common(match: Any, report: Report) -> None:
    for subnet in match.destination_subnets:
        report.check(hosts.validate_ip_subnet(subnet))
    if match.port != 0:
        report.check(hosts.validate_port(match.port))
    report.errors.extend(label_map_errors(match.source_labels))


def _check_tls_route(route: Any, vs: Any, gateway_semantics: bool, report: Report) -> None:
    if not route.match:
        report.error("TLS route must have at least one match condition")
    for match in route.match:
        if not match.sni_hosts:
            report.error("TLS match must have at least one SNI host")
        for sni in match.sni_hosts:
            _sni_host_check(sni, vs, report)
        _check_l4_match_common(match, report)
        check_gateway_names(match.gateways, False, report)
    if not route.route:
        report.error("TLS route is required")
    for destination in route.route:
        check_weighted_destination(destination, gateway_semantics, report)
    check_total_weight(route.route, report)


def _check_tcp_route(route: Any, gateway_semantics: bool, report: Report) -> None:
    for match in route.match:
        _check_l4_match_common(match, report)
        # istiod drops the warnings about gateway names given in TCP matches.
        scratch = Report()
        check_gateway_names(match.gateways, False, scratch)
        report.extend_errors(scratch)
    if not route.route:
        report.error("TCP route is required")
    for destination in route.route:
        check_weighted_destination(destination, gateway_semantics, report)
    check_total_weight(route.route, report)


def _check_jwt_claim_routes(vs: Any, report: Report) -> None:
    """Routing on JWT claims only works where the gateway validates the JWT."""
    for route in vs.http:
        for match in route.match:
            for header_map in (match.headers, match.without_headers):
                for key in header_map:
                    if matches.is_jwt_routing_claim(key):
                        report.error(
                            f"JWT claim based routing (key: {key}) is only supported for gateway, "
                            f"found no gateways: {go_list(vs.gateways)}"
                        )


def _check_hosts(vs: Any, applies_to_mesh: bool, applies_to_gateway: bool, report: Report) -> None:
    all_valid = True
    sni = _has_sni_hosts(vs)
    for host in vs.hosts:
        if applies_to_gateway:
            problem = hosts.validate_wildcard_domain_for_gateway_vs(sni, host)
        else:
            problem = hosts.validate_wildcard_domain(host)
        if problem:
            # IP hosts are accepted without comment.
            if not hosts.is_ip_address(host):
                report.error(problem)
                all_valid = False
        elif applies_to_mesh and host == "*":
            report.error("wildcard host * is not allowed for virtual services bound to the mesh gateway")
            all_valid = False
    if not all_valid:
        return
    names = list(vs.hosts)
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            if hosts.host_matches(first, second):
                report.error(f"duplicate hosts in virtual service: {first} & {second}")


@register(Kind.VIRTUAL_SERVICE)
def validate_virtual_service(config: Config, report: Report) -> None:
    """A VirtualService, including warnings about rules that can never match."""
    vs = config.spec
    delegate = not vs.hosts
    if delegate:
        # A delegate VirtualService is included by a root one; only HTTP routes make sense there.
        if vs.gateways:
            report.error("delegate virtual service must have no gateways specified")
        if vs.tls:
            report.error("delegate virtual service must have no tls route specified")
        if vs.tcp:
            report.error("delegate virtual service must have no tcp route specified")
    gateway_semantics = config.meta.annotations.get(ROUTE_SEMANTICS_ANNOTATION) == "gateway"

    applies_to_mesh = not vs.gateways
    applies_to_gateway = False
    if vs.gateways:
        check_gateway_names(vs.gateways, gateway_semantics, report)
        applies_to_gateway = MESH_GATEWAY not in vs.gateways
        applies_to_mesh = not applies_to_gateway
    if not applies_to_gateway:
        _check_jwt_claim_routes(vs, report)

    _check_hosts(vs, applies_to_mesh, applies_to_gateway, report)
    if not vs.http and not vs.tcp and not vs.tls:
        report.error("http, tcp or tls must be provided in virtual service")
    for route in vs.http:
        check_http_route(route, delegate, gateway_semantics, report)
    for tls_route in vs.tls:
        _check_tls_route(tls_route, vs, gateway_semantics, report)
    for tcp_route in vs.tcp:
        _check_tcp_route(tcp_route, gateway_semantics, report)
    report.errors.extend(export_to_errors(config.meta.namespace, vs.export_to))
    warn_unreachable_rules(vs, report)
