"""WorkloadEntry, and the endpoint checks ServiceEntry shares with it."""

from __future__ import annotations

from collections.abc import Set
from typing import Any

from meshpilot.config.validation import hosts
from meshpilot.config.validation.formatting import go_quote
from meshpilot.config.validation.registry import register
from meshpilot.config.validation.report import Report
from meshpilot.config.validation.selectors import label_map_errors
from meshpilot.model.config import Config
from meshpilot.model.kind import Kind


def check_workload_entry(
    entry: Any, service_ports: Set[str] | None, allow_fqdn: bool, report: Report
) -> None:
    """A WorkloadEntry, standalone (``service_ports`` None, FQDN addresses allowed) or as a
    ServiceEntry STATIC endpoint (its ports must be among the service's, addresses must be IPs)."""
    address = entry.address
    if not address:
        if not entry.network:
            report.error("address is required")
            return
        # A workload on another network may be reachable only through that network's gateway.
        report.warn(f"address is unset with network {go_quote(entry.network)}")
    unix_path = hosts.unix_address(address)
    if unix_path is not None:
        report.check(hosts.validate_unix_address(unix_path))
        if entry.ports:
            report.error(f"unix endpoint {address} must not include ports")
    elif address and not hosts.is_ip_address(address):
        if not allow_fqdn:
            report.error(f"endpoint address {go_quote(address)} is not a valid IP address")
        elif hosts.validate_fqdn(address):
            report.error(f"endpoint address {go_quote(address)} is not a valid FQDN or an IP address")
    for name, number in entry.ports.items():
        if service_ports is not None and name not in service_ports:
            report.error(f"endpoint port {number} is not defined by the service entry")
        report.check(hosts.validate_port_name(name))
        report.check(hosts.validate_port(number))
    report.errors.extend(label_map_errors(entry.labels))
    if unix_path is not None and service_ports is not None and len(service_ports) != 1:
        report.error("exactly 1 service port required for unix endpoints")


@register(Kind.WORKLOAD_ENTRY)
def validate_workload_entry(config: Config, report: Report) -> None:
    """A WorkloadEntry: address (IP, hostname or unix socket), ports and labels.

    serviceAccount, weight, locality and network are not checked, as in istiod.
    """
    check_workload_entry(config.spec, None, True, report)
