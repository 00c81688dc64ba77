"""Istio specs parse strictly, with Go durations, as istiod decodes them."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from meshpilot._proto.istio.networking.v1alpha3 import destination_rule_pb2, virtual_service_pb2
from meshpilot.config.errors import ConfigError
from meshpilot.config.protojson import parse_go_duration, parse_spec


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("5m", "300"),
        ("1h30m", "5400"),
        ("250ms", "0.25"),
        ("1.5s", "1.5"),
        ("0", "0"),
        ("-2s", "-2"),
        ("10us", "0.00001"),
        ("10µs", "0.00001"),
        ("3ns", "0.000000003"),
        ("1h0.5s", "3600.5"),
    ],
)
def test_go_durations(text: str, seconds: str) -> None:
    assert parse_go_duration(text) == Decimal(seconds)


@pytest.mark.parametrize("text", ["", "5", "5x", "m", "1.s5", "--1s", "1 s"])
def test_invalid_go_durations(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_go_duration(text)


def test_durations_and_nested_fields_parse() -> None:
    vs = virtual_service_pb2.VirtualService()
    parse_spec(
        {
            "hosts": ["a"],
            "http": [
                {
                    "timeout": "5m",
                    "retries": {"attempts": 3, "perTryTimeout": "250ms"},
                    "route": [{"destination": {"host": "a", "port": {"number": 80}}}],
                }
            ],
        },
        vs,
    )
    assert vs.http[0].timeout.seconds == 300
    assert vs.http[0].retries.per_try_timeout.nanos == 250_000_000
    assert vs.http[0].route[0].destination.port.number == 80
    dr = destination_rule_pb2.DestinationRule()
    parse_spec(
        {
            "host": "a",
            "trafficPolicy": {
                "portLevelSettings": [{"port": {"number": 80}, "outlierDetection": {"interval": "1m"}}]
            },
        },
        dr,
    )
    assert dr.traffic_policy.port_level_settings[0].outlier_detection.interval.seconds == 60


@pytest.mark.parametrize(
    ("spec", "path", "reason"),
    [
        ({"hosts": "a"}, "spec.hosts", "must be a list, got a string"),
        ({"hostz": ["a"]}, "spec.hostz", "unknown field 'hostz' in VirtualService"),
        ({"http": [{"timeout": "5x"}]}, "spec.http[0].timeout", "invalid duration '5x'"),
        ({"http": [{"timeout": 5}]}, "spec.http[0].timeout", "must be a duration"),
        (
            {"http": [{"route": [{"destination": {"host": 1}}]}]},
            "spec.http[0].route[0].destination.host",
            "must be a string, got an integer",
        ),
        ({"http": [{"retries": {"attempts": "x"}}]}, "spec.http[0].retries.attempts", "must be an integer"),
        ({"tcp": [{"route": [{"weight": True}]}]}, "spec.tcp[0].route[0].weight", "must be an integer"),
        (
            {"http": [{"match": [{"headers": {"a": "b"}}]}]},
            "spec.http[0].match[0].headers.a",
            "must be an object",
        ),
        (
            {"http": [{"redirect": {"derivePort": "NOPE"}}]},
            "spec.http[0].redirect.derivePort",
            "unknown value 'NOPE'",
        ),
        ("text", "spec", "must be an object"),
    ],
)
def test_wrong_types_and_unknown_fields_name_the_field(spec: Any, path: str, reason: str) -> None:
    with pytest.raises(ConfigError) as failure:
        parse_spec(spec, virtual_service_pb2.VirtualService())
    assert failure.value.path == path
    assert reason in failure.value.reason


def test_integers_written_as_strings_are_accepted_as_jsonpb_does() -> None:
    vs = virtual_service_pb2.VirtualService()
    parse_spec({"http": [{"route": [{"weight": "30", "destination": {"host": "a"}}]}]}, vs)
    assert vs.http[0].route[0].weight == 30
