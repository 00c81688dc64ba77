"""DestinationRule."""

from __future__ import annotations

from typing import Any

from meshpilot.config.validation import hosts
from meshpilot.config.validation.registry import register
from meshpilot.config.validation.report import Report
from meshpilot.config.validation.route_parts import validate_subset_name
from meshpilot.config.validation.selectors import check_workload_selector, label_map_errors
from meshpilot.config.validation.traffic_policy import check_traffic_policy
from meshpilot.config.validation.visibility import export_to_errors
from meshpilot.model.config import Config
from meshpilot.model.kind import Kind


def _check_subset(namespace: str, subset: Any, report: Report) -> None:
    report.check(validate_subset_name(subset.name))
    report.errors.extend(label_map_errors(subset.labels))
    if subset.HasField("traffic_policy"):
        # istiod drops the warnings of subset traffic policies.
        scratch = Report()
        check_traffic_policy(namespace, subset.traffic_policy, scratch)
        report.extend_errors(scratch)


@register(Kind.DESTINATION_RULE)
def validate_destination_rule(config: Config, report: Report) -> None:
    """A DestinationRule: host, traffic policies, subsets, exportTo and workload selector."""
    rule = config.spec
    namespace = config.meta.namespace
    # "*" alone is a valid host here, unlike in VirtualService destinations.
    report.check(hosts.validate_wildcard_domain(rule.host))
    if rule.HasField("traffic_policy"):
        check_traffic_policy(namespace, rule.traffic_policy, report)
    names: set[str] = set()
    for subset in rule.subsets:
        if subset.name in names:
            report.error(f"duplicate subset names: {subset.name}")
        names.add(subset.name)
        _check_subset(namespace, subset, report)
    report.errors.extend(
        export_to_errors(namespace, rule.export_to, is_dr_with_selector=rule.HasField("workload_selector"))
    )
    check_workload_selector(rule, "workload_selector", report)
