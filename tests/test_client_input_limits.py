"""The limits on client input (``input_limits``), clipped log text (``bounded_logs``) and bounded
metric labels (``metric_labels``), and the injection webhook's answers to annotations over them."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from meshpilot.bounded_logs import WarningBudget, clip
from meshpilot.input_limits import MAX_NESTING, InputRejected, check_nesting, load_json, load_yaml
from meshpilot.metric_labels import OTHER, UNKNOWN, ProxyVersions, admission_resource, xds_type
from meshpilot.model.proxy import InvalidNode, NodeMetadata
from meshpilot.webhooks.inject.config import parse_config
from meshpilot.webhooks.inject.review import handle_inject


def test_json_and_yaml_within_limits_parse_and_deeper_is_refused() -> None:
    assert load_json('{"a": [1]}', "x") == {"a": [1]}
    assert load_yaml("a: [1]", "x") == {"a": [1]}
    for text in ("[" * (MAX_NESTING + 1) + "]" * (MAX_NESTING + 1), "[" * 100_000):
        with pytest.raises(InputRejected, match=r"x: nested deeper|x: not valid"):
            load_json(text, "x")
    with pytest.raises(InputRejected, match="nested deeper than the limit of 100 levels"):
        load_yaml("[" * 101 + "]" * 101, "x")
    with pytest.raises(InputRejected, match="aliases"):
        load_yaml("a: &x [1]\nb: *x", "x")
    with pytest.raises(InputRejected, match="not valid JSON"):
        load_json("1" * 5000, "x")  # int() refuses past 4300 digits: still a refusal, not a crash
    with pytest.raises(InputRejected, match="characters, at most"):
        load_json(" " * 300_000, "x")
    check_nesting({"a": [{"b": 1}]}, "x", limit=3)
    with pytest.raises(InputRejected):
        check_nesting({"a": [{"b": {}}]}, "x", limit=3)


def test_deep_pod_ports_are_an_invalid_node() -> None:
    with pytest.raises(InvalidNode, match="POD_PORTS: nested deeper"):
        NodeMetadata.parse({"POD_PORTS": "[" * 20_000 + "]" * 20_000})


def test_clip_is_one_short_printable_line() -> None:
    assert clip("plain") == "plain"
    clipped = clip("a\nb\u00e9" + "x" * 10_000, 20)
    assert clipped.startswith("a\\nb\\xe9") and clipped.endswith("...(10004 chars)") and clipped.isascii()
    assert len(clip("\u4e2d" * 1000, 50)) < 80


def test_warning_budget_lets_a_burst_through_per_interval_and_counts_the_rest() -> None:
    now = [0.0]
    budget = WarningBudget(burst=2, interval=10, clock=lambda: now[0])
    assert [budget.allow() for _ in range(5)] == [True, True, False, False, False]
    now[0] = 11
    assert budget.allow() and budget.take_suppressed() == " (3 similar warnings suppressed)"


def test_labels_from_clients_fall_into_known_sets() -> None:
    assert xds_type("type.googleapis.com/envoy.config.cluster.v3.Cluster") == "cds"
    assert xds_type("type.googleapis.com/made.Up") == OTHER
    versions = ProxyVersions(limit=2)
    labels = [versions.acquire(v) for v in ("1.28.0", "1.28.0-distroless", "1.29.1", "1.30.0", "dev\n", "")]
    assert labels == ["1.28.0", "1.28.0", "1.29.1", OTHER, UNKNOWN, UNKNOWN]
    assert versions.release("1.29.1") is not False  # the last 1.29.1 proxy left: its series can go
    assert versions.acquire("1.31.2") == "1.31.2"
    assert admission_resource("networking.istio.io", "v1", "virtualservices") == (
        "networking.istio.io",
        "v1",
        "virtualservices",
    )
    assert admission_resource("networking.istio.io", "v9", "nope") == ("networking.istio.io", OTHER, OTHER)
    assert admission_resource("evil.io", "v1", "pods") == (OTHER, OTHER, OTHER)


POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p", "namespace": "default", "annotations": {}},
    "spec": {"containers": [{"name": "app", "image": "app:1"}]},
}


@pytest.mark.parametrize(
    ("annotation", "value", "reason"),
    [
        (
            "proxy.istio.io/config",
            "a:\n" + "".join("  " * i + "b:\n" for i in range(1, 300)),
            "nested deeper",
        ),
        ("proxy.istio.io/config", "[" * 100_000, "not valid YAML|nested deeper"),
        ("sidecar.istio.io/userVolume", "{" * 100_000 + "}" * 100_000, "nested deeper|not valid JSON"),
        ("proxy.istio.io/overrides", '{"a":' * 5000 + "1" + "}" * 5000, "nested deeper"),
        ("sidecar.istio.io/proxyCPU", "1" * 1_000_000, "a number of 1000000 characters, at most 64"),
        ("sidecar.istio.io/proxyMemory", "1e999999999", "out of range"),
        ("status.sidecar.istio.io/port", "\u00b2", "is not a port number"),
    ],
)
def test_annotations_over_the_limits_are_denied_with_the_reason(
    annotation: str, value: str, reason: str
) -> None:
    pod = copy.deepcopy(POD)
    pod["metadata"]["annotations"][annotation] = value
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u", "namespace": "default", "operation": "CREATE", "object": pod},
    }
    response = handle_inject(review, parse_config("policy: enabled\n"))["response"]
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert "internal error" not in message and len(message) < 5000
    assert any(part in message for part in reason.split("|")), message
