"""Telemetry validation: what istiod's ValidateTelemetry refuses (and warns about), with its messages."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from meshpilot.config.decode import decode_object
from meshpilot.config.errors import ValidationError
from meshpilot.config.validation import check_config
from meshpilot.config.validation.cel import CelSyntaxError, check
from meshpilot.model.config import Config


def _config(spec: str, api_version: str = "telemetry.istio.io/v1") -> Config:
    raw = {
        "apiVersion": api_version,
        "kind": "Telemetry",
        "metadata": {"name": "t", "namespace": "default"},
        "spec": yaml.safe_load(spec),
    }
    try:
        config = decode_object(raw).obj
    except ValidationError as err:
        raise AssertionError(f"refused at decode: {err}") from err
    assert isinstance(config, Config)
    return config


def _errors(spec: str) -> set[str]:
    raw = {
        "apiVersion": "telemetry.istio.io/v1",
        "kind": "Telemetry",
        "metadata": {"name": "t", "namespace": "default"},
        "spec": yaml.safe_load(spec),
    }
    try:
        decode_object(raw)
    except ValidationError as err:
        return set(err.errors)
    return set()


def test_a_full_object_is_accepted_in_both_versions() -> None:
    spec = """
    selector: {matchLabels: {app: api}}
    metrics:
    - providers: [{name: prometheus}]
      reportingInterval: 10s
      overrides:
      - match: {metric: REQUEST_COUNT, mode: CLIENT}
        tagOverrides: {a: {value: "x"}, b: {operation: REMOVE}}
      - match: {customMetric: my_total}
        disabled: true
    tracing:
    - providers: [{name: zipkin}]
      randomSamplingPercentage: 12.5
      customTags: {t: {literal: {value: v}}, h: {header: {name: x-h}}, e: {environment: {name: POD}}}
    accessLogging:
    - providers: [{name: envoy}]
      filter: {expression: "response.code >= 400 && request.headers['x-debug'] == '1'"}
    """
    for version in ("telemetry.istio.io/v1", "telemetry.istio.io/v1alpha1"):
        config = _config(spec, version)
        assert check_config(config).errors == []


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("{metrics: [{providers: [{name: ''}]}]}", "providers.name may not be empty"),
        ("{accessLogging: [{providers: [{}]}]}", "providers.name may not be empty"),
        (
            "{metrics: [{overrides: [{tagOverrides: {a: {operation: UPSERT}}}]}]}",
            "tagOverrides.value must be set when operation is UPSERT",
        ),
        (
            "{metrics: [{overrides: [{tagOverrides: {a: {operation: REMOVE, value: x}}}]}]}",
            "tagOverrides.value may only be set when operation is UPSERT",
        ),
        ("{metrics: [{overrides: [{match: {customMetric: ''}}]}]}", "customMetric may not be empty"),
        (
            "{tracing: [{randomSamplingPercentage: 101}]}",
            "randomSamplingPercentage must be in range [0.0, 100.0]",
        ),
        (
            "{tracing: [{randomSamplingPercentage: -1}]}",
            "randomSamplingPercentage must be in range [0.0, 100.0]",
        ),
        ("{tracing: [{customTags: {t: {literal: {}}}}]}", "literal tag value may not be empty"),
        ("{tracing: [{customTags: {t: {header: {}}}}]}", "header tag name may not be empty"),
        ("{tracing: [{customTags: {t: {environment: {}}}}]}", "environment tag name may not be empty"),
        (
            "{selector: {matchLabels: {a: b}}, "
            "targetRefs: [{kind: Gateway, group: gateway.networking.k8s.io, name: g}]}",
            "only one of targetRefs or workloadSelector can be set",
        ),
    ],
)
def test_refused_as_istiod_refuses(spec: str, message: str) -> None:
    assert message in _errors(spec)


def test_an_access_log_filter_that_is_not_cel_is_refused() -> None:
    errors = _errors("{accessLogging: [{filter: {expression: 'response.code >='}}]}")
    assert len(errors) == 1
    assert next(iter(errors)).startswith("must be a valid CEL expression")


def test_warnings_are_istiods() -> None:
    config = _config(
        "{tracing: [{providers: [{name: a}, {name: b}]}, {}], "
        "metrics: [{overrides: [{tagOverrides: {'': {value: x}}}]}]}"
    )
    report = check_config(config)
    assert report.errors == []
    assert set(report.warnings) == {
        "multiple tracing is not currently supported",
        "multiple providers is not currently supported",
        "tagOverrides.name may not be empty",
    }


@pytest.mark.parametrize(
    "text",
    [
        "response.code >= 400",
        "request.headers['x-a'] == 'b' || !(connection.mtls)",
        "xds.cluster_name.startsWith('outbound') ? true : false",
        "[1, 2, 3].exists(x, x > 2u) && {'k': 1.5e3}['k'] > .5",
        "request.url_path.matches(r'^/api/.*') && size(b'xy') == 2",
        "google.protobuf.Duration{seconds: 10} > duration('1s')",
        "x in ['a', 'b',]",
    ],
)
def test_cel_expressions_parse(text: str) -> None:
    check(text)


@pytest.mark.parametrize(
    "text",
    ["", "a &&& b", "(a", "a b", "f(,)", "1 +", "'open", "a.if", "{1:}", "a = b", "x ? y", "a.", "1..2"],
)
def test_not_cel(text: str) -> None:
    with pytest.raises(CelSyntaxError):
        check(text)


def test_both_versions_decode_into_one_message() -> None:
    config: Any = _config("{metrics: [{providers: [{name: prometheus}]}]}")
    assert config.spec.DESCRIPTOR.full_name == "istio.telemetry.v1alpha1.Telemetry"
