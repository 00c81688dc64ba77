"""Label maps, workload selectors and policy target references."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from meshpilot.config.validation.formatting import go_quote
from meshpilot.config.validation.report import Report

_LABEL = r"[a-zA-Z0-9](?:[-a-zA-Z0-9]*[a-zA-Z0-9])?"
_QUALIFIED_NAME = r"(?:[A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
# An optional "dns.prefix/" then a name, as in Kubernetes label keys.
_TAG_KEY = re.compile(rf"({_LABEL}(?:\.{_LABEL})*/)?({_QUALIFIED_NAME})")
_TAG_VALUE = re.compile(rf"(?:{_QUALIFIED_NAME})?")

NO_LABELS_WARNING = "workload selector specified without labels"


def _tag_key_error(key: str) -> str | None:
    match = _TAG_KEY.fullmatch(key)
    if match is None:
        return f"invalid tag key: {go_quote(key)}"
    prefix = match.group(1)
    if prefix and len(prefix) - 1 > 253:
        return f"invalid tag key: {go_quote(key)} (DNS prefix is too long)"
    if len(match.group(2)) > 63:
        return f"invalid tag key: {go_quote(key)} (name is too long)"
    return None


def label_map_errors(labels: Mapping[str, str]) -> list[str]:
    """Keys and values of a label map (subset labels, sourceLabels, endpoint labels).

    Unlike Kubernetes, values have no length limit here.
    """
    errors = []
    for key, value in labels.items():
        problem = _tag_key_error(key)
        if problem:
            errors.append(problem)
        if _TAG_VALUE.fullmatch(value) is None:
            errors.append(f"invalid tag value: {go_quote(value)}")
    return errors


def _selector_label_errors(labels: Mapping[str, str]) -> list[str]:
    errors = []
    for key, value in labels.items():
        pair = go_quote(f"{key}={value}")
        if not key:
            errors.append(f"empty key is not supported in selector: {pair}")
        if "*" in key or "*" in value:
            errors.append(f"wildcard is not supported in selector: {pair}")
    return errors


def check_workload_selector(owner: Any, field: str, report: Report) -> None:
    """A ``type.v1beta1.WorkloadSelector`` (``matchLabels``), used by the security kinds and
    DestinationRule. Present but without labels is allowed, with a warning."""
    if not owner.HasField(field):
        return
    labels = getattr(owner, field).match_labels
    report.errors.extend(_selector_label_errors(labels))
    if not labels:
        report.warn(NO_LABELS_WARNING)


def alpha_selector_check(owner: Any, field: str) -> tuple[list[str], bool]:
    """A ``networking.WorkloadSelector`` (``labels``), used by Sidecar and ServiceEntry.

    Returns the errors, and whether the selector is present without labels
    (each kind words that warning its own way).
    """
    if not owner.HasField(field):
        return [], False
    labels = getattr(owner, field).labels
    return _selector_label_errors(labels), not labels


_ALLOWED_TARGETS = frozenset(
    {
        ("core", "Service"),
        ("networking.istio.io", "ServiceEntry"),
        ("gateway.networking.k8s.io", "Gateway"),
        ("gateway.networking.k8s.io", "GatewayClass"),
    }
)
_ALLOWED_TARGETS_TEXT = (
    "[core/v1/Service networking.istio.io/v1/ServiceEntry "
    "gateway.networking.k8s.io/v1/Gateway gateway.networking.k8s.io/v1/GatewayClass]"
)


def check_one_of_selector_type(spec: Any, report: Report) -> None:
    """At most one of ``selector``, ``targetRef`` and ``targetRefs``."""
    chosen = [spec.HasField("selector"), spec.HasField("targetRef"), len(spec.targetRefs) > 0]
    if sum(chosen) > 1:
        report.error("only one of targetRefs or workloadSelector can be set")


def check_target_ref(ref: Any, report: Report) -> None:
    """A PolicyTargetReference: named, same namespace, and of a kind policies can attach to."""
    if not ref.name:
        report.error("targetRef name must be set")
    if ref.namespace:
        report.error("targetRef namespace must not be set; cross namespace referencing is not supported")
    if (ref.group or "core", ref.kind) not in _ALLOWED_TARGETS:
        report.error(f"targetRef must be to one of {_ALLOWED_TARGETS_TEXT} but was {ref.group}/{ref.kind}")


def check_policy_targets(spec: Any, report: Report) -> None:
    """The selector/targetRef/targetRefs of AuthorizationPolicy and RequestAuthentication."""
    check_one_of_selector_type(spec, report)
    check_workload_selector(spec, "selector", report)
    if spec.HasField("targetRef"):
        check_target_ref(spec.targetRef, report)
    for ref in spec.targetRefs:
        check_target_ref(ref, report)
