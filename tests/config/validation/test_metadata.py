"""Metadata checks: Kubernetes ObjectMeta rules (for objects read from files) and istiod's annotations."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from meshpilot._proto.istio.networking.v1alpha3 import destination_rule_pb2, gateway_pb2
from meshpilot.config.errors import ValidationError
from meshpilot.config.validation import check_config, validate_config
from meshpilot.model.config import Config, ConfigMeta
from meshpilot.model.kind import Kind

DR_SPEC = "{host: reviews}"
SUBDOMAIN = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)


@pytest.mark.parametrize("name", ["reviews", "reviews.v1", "a", "1-2", "a" * 253])
def test_valid_names(name: str, validate: Callable[..., Any]) -> None:
    assert validate("DestinationRule", DR_SPEC, name=name).errors == []


@pytest.mark.parametrize("name", ["Reviews", "reviews_v1", "-reviews", "reviews.", "re views"])
def test_invalid_names(name: str, validate: Callable[..., Any]) -> None:
    outcome = validate("DestinationRule", DR_SPEC, name=name)
    assert outcome.errors == [f'metadata.name: Invalid value: "{name}": {SUBDOMAIN}']


def test_too_long_name(validate: Callable[..., Any]) -> None:
    name = "a" * 254
    assert validate("DestinationRule", DR_SPEC, name=name).errors == [
        f'metadata.name: Invalid value: "{name}": must be no more than 253 characters'
    ]


def test_missing_name_through_validate_config() -> None:
    # decode_object refuses a nameless object earlier; a Config built elsewhere can still lack one.
    config = Config(ConfigMeta(Kind.DESTINATION_RULE, "", "default"), _dr_spec())
    with pytest.raises(ValidationError) as err:
        validate_config(config)
    assert err.value.errors == ["metadata.name: Required value: name or generateName is required"]


def _dr_spec() -> Any:
    return destination_rule_pb2.DestinationRule(host="reviews")


def test_invalid_namespace(validate: Callable[..., Any]) -> None:
    outcome = validate("DestinationRule", DR_SPEC, namespace="Prod.ns")
    assert len(outcome.errors) == 1
    assert outcome.errors[0].startswith(
        'metadata.namespace: Invalid value: "Prod.ns": a lowercase RFC 1123 label'
    )


def test_label_and_annotation_syntax(validate: Callable[..., Any]) -> None:
    outcome = validate(
        "DestinationRule",
        DR_SPEC,
        labels={"app": "ok", "bad key": "v", "k": "bad value"},
        annotations={"/no-prefix": "x", "example.com/ok": "any value at all"},
    )
    assert len(outcome.errors) == 3
    assert any(
        e.startswith('metadata.labels: Invalid value: "bad key": name part must consist of')
        for e in outcome.errors
    )
    assert any(
        e.startswith('metadata.labels: Invalid value: "bad value": a valid label must be')
        for e in outcome.errors
    )
    assert (
        'metadata.annotations: Invalid value: "/no-prefix": prefix part must be non-empty' in outcome.errors
    )


def test_annotation_size_limit(validate: Callable[..., Any]) -> None:
    outcome = validate("DestinationRule", DR_SPEC, annotations={"big": "x" * (256 * 1024)})
    assert outcome.errors == ["metadata.annotations: Too long: must have at most 262144 bytes"]


def test_object_meta_errors_stop_validation(validate: Callable[..., Any]) -> None:
    # The API server would refuse the object before istiod looked at its spec.
    outcome = validate(
        "DestinationRule", "{host: ''}", name="Bad_Name", annotations={"istio.io/dry-run": "true"}
    )
    assert outcome.errors == [f'metadata.name: Invalid value: "Bad_Name": {SUBDOMAIN}']


def test_istio_annotation_errors_stop_validation(validate: Callable[..., Any]) -> None:
    outcome = validate(
        "DestinationRule", "{host: ''}", annotations={"internal.istio.io/parent-namespace": "x"}
    )
    assert outcome.errors == [
        '"internal.istio.io/parent-namespace" annotation found, this may not be set by users'
    ]


def test_dry_run_is_checked_before_other_annotations(validate: Callable[..., Any]) -> None:
    annotations = {"istio.io/dry-run": "true", "internal.istio.io/webhook-always-reject": "y"}
    outcome = validate("Sidecar", "{egress: [{hosts: ['*/*']}]}", annotations=annotations)
    assert outcome.errors == [
        "default/x has unsupported annotation istio.io/dry-run, please remove the annotation"
    ]


def test_check_config_reports_warnings_with_errors() -> None:
    spec = gateway_pb2.Gateway()
    server = spec.servers.add(hosts=["*"])
    server.port.number, server.port.name, server.port.protocol = 9000, "tcp", "TCP"
    server.tls.https_redirect = True
    report = check_config(Config(ConfigMeta(Kind.GATEWAY, "gw", "default"), spec))
    assert report.errors == ["server cannot have TLS settings for non HTTPS/TLS ports"]
    assert report.warnings == ["tls.httpsRedirect should only be used with http servers"]
