"""Pieces of VirtualService routes that other kinds reuse: destinations and gateway names."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from meshpilot.config.validation import hosts
from meshpilot.config.validation.formatting import go_quote
from meshpilot.config.validation.quantities import validate_weight
from meshpilot.config.validation.report import Report


def validate_subset_name(name: str) -> str | None:
    """A subset name (in a DestinationRule, or referenced by a destination) is a DNS label."""
    if not name:
        return "subset name cannot be empty"
    if not hosts.is_dns1123_label(name):
        return f"subset name is invalid: {name}"
    return None


def destination_errors(destination: Any) -> list[str]:
    """A Destination: a host other than ``*`` (short names and ``*.x`` are fine), subset and port."""
    errors: list[str | None] = []
    if destination.host == "*":
        errors.append("invalid destination host *")
    else:
        errors.append(hosts.validate_wildcard_domain(destination.host))
    if destination.subset:
        errors.append(validate_subset_name(destination.subset))
    if destination.HasField("port"):
        errors.append(hosts.validate_port(destination.port.number))
    return [e for e in errors if e is not None]


def check_weighted_destination(route: Any, gateway_semantics: bool, report: Report) -> None:
    """One weighted destination of a route (HTTP, TLS or TCP)."""
    if not route.HasField("destination"):
        report.error("destination is required")
    elif not gateway_semantics:
        # Routes generated from the Gateway API may point at backends that are not hostnames.
        report.errors.extend(destination_errors(route.destination))
    report.check(validate_weight(route.weight))


def check_total_weight(routes: Sequence[Any], report: Report) -> None:
    """Weights may be all zero only with a single destination."""
    if len(routes) > 1 and sum(r.weight for r in routes) == 0:
        report.error("total destination weight = 0")


def check_gateway_names(names: Sequence[str], gateway_semantics: bool, report: Report) -> None:
    """Gateway references in a VirtualService or one of its matches: ``namespace/name``, or a
    legacy name."""
    for name in names:
        ns, slash, gateway = name.partition("/")
        if not slash:
            if "." in name:
                parts = name.split(".")
                recommended = f"{parts[1]}/{parts[0]}"
                report.warn(
                    f"using legacy gatewayName format {go_quote(name)}; prefer the <namespace>/<name> "
                    f"format: {go_quote(recommended)}"
                )
            report.check(hosts.validate_fqdn(name))
            # istiod stops at the first name without a namespace; later names go unchecked.
            return
        if not ns or not gateway:
            report.error("config namespace and gateway name cannot be empty")
        if not hosts.is_dns1123_label(ns):
            report.error(f"invalid value for namespace: {go_quote(ns)}")
        if not hosts.is_dns1123_label(gateway) and not gateway_semantics:
            report.error(f"invalid value for gateway name: {go_quote(gateway)}")
