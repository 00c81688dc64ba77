"""Telemetry (``telemetry.istio.io``), as istiod's ValidateTelemetry checks it."""

from __future__ import annotations

from typing import Any

from meshpilot._proto.istio.telemetry.v1alpha1 import telemetry_pb2
from meshpilot.config.validation import cel
from meshpilot.config.validation.registry import register
from meshpilot.config.validation.report import Report
from meshpilot.config.validation.selectors import check_policy_targets
from meshpilot.model.config import Config
from meshpilot.model.kind import Kind

_UPSERT = telemetry_pb2.MetricsOverrides.TagOverride.UPSERT
_REMOVE = telemetry_pb2.MetricsOverrides.TagOverride.REMOVE


@register(Kind.TELEMETRY)
def validate_telemetry(config: Config, report: Report) -> None:
    """A Telemetry: its targets, and its metrics, tracing and access logging."""
    spec = config.spec
    check_policy_targets(spec, report)
    _metrics(spec.metrics, report)
    _tracing(spec.tracing, report)
    _access_logging(spec.access_logging, report)


def _providers(providers: Any, report: Report) -> None:
    if any(not ref.name for ref in providers):
        report.error("providers.name may not be empty")


def _metrics(metrics: Any, report: Report) -> None:
    for entry in metrics:
        _providers(entry.providers, report)
        for override in entry.overrides:
            for name, tag in override.tag_overrides.items():
                if not name:
                    report.warn("tagOverrides.name may not be empty")
                if tag.operation == _UPSERT and not tag.value:
                    report.error("tagOverrides.value must be set when operation is UPSERT")
                elif tag.operation == _REMOVE and tag.value:
                    report.error("tagOverrides.value may only be set when operation is UPSERT")
            if (
                override.match.WhichOneof("metric_match") == "custom_metric"
                and not override.match.custom_metric
            ):
                report.error("customMetric may not be empty")


def _tracing(tracing: Any, report: Report) -> None:
    if len(tracing) > 1:
        report.warn("multiple tracing is not currently supported")
    for entry in tracing:
        if len(entry.providers) > 1:
            report.warn("multiple providers is not currently supported")
        _providers(entry.providers, report)
        percentage = entry.random_sampling_percentage.value
        if percentage < 0 or percentage > 100:
            report.error("randomSamplingPercentage must be in range [0.0, 100.0]")
        for name, tag in entry.custom_tags.items():
            if not name:
                report.error("tag name may not be empty")
            which = tag.WhichOneof("type")
            if which == "literal" and not tag.literal.value:
                report.error("literal tag value may not be empty")
            elif which == "header" and not tag.header.name:
                report.error("header tag name may not be empty")
            elif which == "environment" and not tag.environment.name:
                report.error("environment tag name may not be empty")


def _access_logging(logging: Any, report: Report) -> None:
    for entry in logging:
        if entry.HasField("filter"):
            try:
                cel.check(entry.filter.expression)
            except cel.CelSyntaxError as err:
                report.error(f"must be a valid CEL expression, {err}")
        _providers(entry.providers, report)
