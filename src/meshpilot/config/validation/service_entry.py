"""ServiceEntry."""

from __future__ import annotations

import os
from typing import Any

from meshpilot._proto.istio.networking.v1alpha3 import service_entry_pb2
from meshpilot.config.validation import goparse, hosts
from meshpilot.config.validation.formatting import enum_name, go_quote
from meshpilot.config.validation.registry import register
from meshpilot.config.validation.report import Report
from meshpilot.config.validation.selectors import alpha_selector_check, label_map_errors
from meshpilot.config.validation.visibility import export_to_errors
from meshpilot.config.validation.workload_entry import check_workload_entry
from meshpilot.model.config import Config
from meshpilot.model.kind import Kind

_SE = service_entry_pb2.ServiceEntry
AUTOALLOCATE_LABEL = "networking.istio.io/enable-autoallocate-ip"


def ip_autoallocation_enabled() -> bool:
    """istiod's PILOT_ENABLE_IP_AUTOALLOCATE feature flag (on by default)."""
    value = os.environ.get("PILOT_ENABLE_IP_AUTOALLOCATE", "")
    try:
        return goparse.parse_bool(value) if value else True
    except goparse.GoParseError:
        return True


def _auto_allocates(config: Config) -> bool:
    """Whether istiod would give this ServiceEntry's hosts virtual IPs."""
    se = config.spec
    opted_out = config.meta.labels.get(AUTOALLOCATE_LABEL, "").lower() == "false"
    return ip_autoallocation_enabled() and se.resolution != _SE.NONE and not opted_out and not se.addresses


def _check_hosts(se: Any, report: Report) -> None:
    if not se.hosts:
        report.error("service entry must have at least one host")
    for host in se.hosts:
        if host == "*":
            report.error("invalid host *")
            continue
        report.check(hosts.validate_wildcard_domain(host))
        if se.resolution != _SE.DYNAMIC_DNS:
            partial = hosts.validate_partial_wildcard(host)
            if partial:
                report.warn(partial)


def _check_ports(se: Any, auto_allocates: bool, report: Report) -> set[str]:
    """Check the ports; returns their names, which endpoints may refer to."""
    names: set[str] = set()
    numbers: set[int] = set()
    for port in se.ports:
        if port.name in names:
            report.error(f"service entry port name {go_quote(port.name)} already defined")
        names.add(port.name)
        if port.number in numbers:
            report.error(f"service entry port {port.number} already defined")
        numbers.add(port.number)
        if port.target_port != 0:
            report.check(hosts.validate_port(port.target_port))
        # Without an address, a TCP port can only be told apart by its port number.
        if not se.addresses and not auto_allocates and port.protocol in ("", "TCP"):
            report.warn(
                "addresses are required for ports serving TCP (or unset) protocol "
                "when IP Autoallocation is not enabled"
            )
        report.check(hosts.validate_port_name(port.name))
        report.check(hosts.validate_protocol(port.protocol))
        report.check(hosts.validate_port(port.number))
    return names


def _check_dns(se: Any, port_names: set[str], report: Report) -> None:
    mode = enum_name(se, "resolution")
    if not se.endpoints:
        # Without endpoints the hosts themselves are resolved, so they must be real names.
        for host in se.hosts:
            problem = hosts.validate_fqdn(host)
            if problem:
                report.error(
                    "hosts must be FQDN or contain only prefix wildcards if no endpoints are provided "
                    f"for resolution mode {mode}, {problem}"
                )
                break
    if se.resolution == _SE.DNS_ROUND_ROBIN and len(se.endpoints) > 1:
        report.error(f"there must only be 0 or 1 endpoint for resolution mode {mode}")
    for endpoint in se.endpoints:
        address = endpoint.address
        if not hosts.is_ip_address(address) and hosts.validate_fqdn(address):
            report.error(f"endpoint address {go_quote(address)} is not a valid FQDN or an IP address")
        report.errors.extend(label_map_errors(endpoint.labels))
        for name, number in endpoint.ports.items():
            if name not in port_names:
                report.error(f"endpoint port {number} is not defined by the service entry")
            report.check(hosts.validate_port_name(name))
            report.check(hosts.validate_port(number))
    has_tcp_port = any(hosts.is_tcp_protocol(hosts.parse_protocol(p.protocol)) for p in se.ports)
    if se.addresses and len(se.hosts) > 1 and has_tcp_port:
        report.warn(
            "service entry can not have more than one host specified simultaneously with address and tcp port"
        )


def _check_dynamic_dns(se: Any, report: Report) -> None:
    """DYNAMIC_DNS as istiod 1.28 supports it: wildcard hosts, HTTP only, mesh-external."""
    mode = enum_name(se, "resolution")
    if not se.hosts:
        report.error(f"at least one wildcard host must be provided for resolution type {mode}")
    for host in se.hosts:
        if not host.startswith("*"):
            report.error(f"host must be wildcarded for resolution mode {mode}")
    # The message texts (missing spaces included) are istiod's.
    if se.addresses:
        report.error(
            f"addresses cannot be set for resolution type {mode}. "
            "HTTP route domains will only be generatedfrom the hosts field values"
        )
    if se.endpoints:
        report.error(
            f"endpoints cannot be set for resolution type {mode}. "
            "Destination IP address determined from hostsfield values"
        )
    for port in se.ports:
        if hosts.parse_protocol(port.protocol) != "HTTP":
            report.error(f"only HTTP protocol is supported for resolution type {mode}")
    if se.location != _SE.MESH_EXTERNAL:
        report.error(f"location must be MESH_EXTERNAL for resolution type {mode}")


@register(Kind.SERVICE_ENTRY)
def validate_service_entry(config: Config, report: Report) -> None:
    """A ServiceEntry: hosts, addresses, ports, endpoints per resolution mode, and exportTo."""
    se = config.spec
    selector_errors, selector_unlabelled = alpha_selector_check(se, "workload_selector")
    if selector_errors:
        report.errors.extend(selector_errors)
        return
    if selector_unlabelled:
        report.warn(
            "service entry: workload selector specified without labels, "
            "will be applied to all services in namespace"
        )
    if se.HasField("workload_selector") and se.endpoints:
        report.error("only one of WorkloadSelector or Endpoints is allowed in Service Entry")

    _check_hosts(se, report)
    has_cidr = False
    for address in se.addresses:
        has_cidr = has_cidr or "/" in address
        report.check(hosts.validate_ip_subnet(address))
    if has_cidr and se.resolution not in (_SE.NONE, _SE.STATIC):
        report.error("CIDR addresses are allowed only for NONE/STATIC resolution types")

    port_names = _check_ports(se, _auto_allocates(config), report)

    resolution = se.resolution
    if resolution == _SE.NONE:
        if se.endpoints:
            report.error("no endpoints should be provided for resolution type none")
        if se.HasField("workload_selector"):
            report.warn("workloadSelector should not be set when resolution mode is NONE")
    elif resolution == _SE.STATIC:
        for endpoint in se.endpoints:
            check_workload_entry(endpoint, port_names, False, report)
    elif resolution in (_SE.DNS, _SE.DNS_ROUND_ROBIN):
        _check_dns(se, port_names, report)
    elif resolution == _SE.DYNAMIC_DNS:
        _check_dynamic_dns(se, report)
    else:
        name = _SE.Resolution.Name(resolution) if resolution in _SE.Resolution.values() else ""
        report.error(f"unsupported resolution type {name}")

    # With several hosts behind one plain TCP port, nothing tells the hosts apart
    # (HTTP has the Host header, TLS the SNI); with NONE the hosts are ignored anyway.
    if resolution != _SE.NONE and len(se.hosts) > 1:
        for port in se.ports:
            protocol = hosts.parse_protocol(port.protocol)
            if not hosts.is_http_protocol(protocol) and not hosts.is_tls_protocol(protocol):
                report.error("multiple hosts provided with non-HTTP, non-TLS ports")
                break

    report.errors.extend(export_to_errors(config.meta.namespace, se.export_to, is_service_entry=True))
