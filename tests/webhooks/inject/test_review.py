"""``handle_inject``: the AdmissionReview envelope, the patch, the counters."""

from __future__ import annotations

import base64
import json
from typing import Any

import jsonpatch
from prometheus_client import CollectorRegistry

from meshpilot.webhooks.inject.config import InjectConfig
from meshpilot.webhooks.inject.review import InjectionMetrics, handle_inject


def _pod(**labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default", "labels": {"app": "a", **labels}},
        "spec": {"containers": [{"name": "app", "image": "app:1"}]},
    }


def _review(pod: Any, api: str = "admission.k8s.io/v1", uid: str = "abc-123") -> dict[str, Any]:
    return {
        "apiVersion": api,
        "kind": "AdmissionReview",
        "request": {"uid": uid, "namespace": "default", "object": pod},
    }


def _value(registry: CollectorRegistry, name: str) -> float:
    value = registry.get_sample_value(name)
    assert value is not None
    return value


def test_v1_response_echoes_uid_and_carries_a_base64_json_patch() -> None:
    pod = _pod()
    out = handle_inject(_review(pod), InjectConfig())
    assert out["apiVersion"] == "admission.k8s.io/v1"
    assert out["kind"] == "AdmissionReview"
    response = out["response"]
    assert response["uid"] == "abc-123"
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    patched = jsonpatch.apply_patch(pod, patch)
    names = [c["name"] for c in patched["spec"]["containers"]]
    assert names == ["app", "istio-proxy"]
    assert [c["name"] for c in patched["spec"]["initContainers"]] == ["istio-init"]
    assert patched["metadata"]["labels"]["security.istio.io/tlsMode"] == "istio"
    # The request's pod is not modified in place.
    assert "initContainers" not in pod["spec"]


def test_v1beta1_is_answered_in_v1beta1() -> None:
    out = handle_inject(_review(_pod(), api="admission.k8s.io/v1beta1", uid="old"), InjectConfig())
    assert out["apiVersion"] == "admission.k8s.io/v1beta1"
    assert out["response"]["uid"] == "old"
    assert out["response"]["patchType"] == "JSONPatch"


def test_skipped_pod_is_allowed_without_a_patch() -> None:
    out = handle_inject(_review(_pod(**{"sidecar.istio.io/inject": "false"})), InjectConfig())
    assert out["response"] == {"uid": "abc-123", "allowed": True}


def test_bad_input_is_refused_with_a_message_not_a_crash() -> None:
    assert handle_inject("nonsense", InjectConfig())["response"]["allowed"] is False
    out = handle_inject(_review(["not", "a", "pod"]), InjectConfig())
    assert out["response"]["allowed"] is False
    assert out["response"]["uid"] == "abc-123"
    assert "not a pod" in out["response"]["status"]["message"]
    wrong = handle_inject(_review(_pod(), api="admission.k8s.io/v2"), InjectConfig())
    assert wrong["response"]["allowed"] is False
    assert "admission.k8s.io/v2" in wrong["response"]["status"]["message"]


def test_counters_count_requests_successes_skips_and_failures() -> None:
    registry = CollectorRegistry()
    metrics = InjectionMetrics.create(registry)
    config = InjectConfig()
    handle_inject(_review(_pod()), config, metrics)
    handle_inject(_review(_pod(**{"sidecar.istio.io/inject": "false"})), config, metrics)
    bad = _pod()
    bad["metadata"]["annotations"] = {"traffic.sidecar.istio.io/includeOutboundIPRanges": "not-a-cidr"}
    refused = handle_inject(_review(bad), config, metrics)
    assert refused["response"]["allowed"] is False
    assert _value(registry, "sidecar_injection_requests_total") == 3
    assert _value(registry, "sidecar_injection_success_total") == 1
    assert _value(registry, "sidecar_injection_skip_total") == 1
    assert _value(registry, "sidecar_injection_failure_total") == 1
    # Every request's time is recorded, in istiod's buckets.
    assert _value(registry, "sidecar_injection_time_seconds_count") == 3
    assert _value(registry, "sidecar_injection_time_seconds_sum") > 0
    assert registry.get_sample_value("sidecar_injection_time_seconds_bucket", {"le": "60.0"}) == 3


def test_malformed_pods_are_refused_with_the_reason() -> None:
    cases = [
        ({"metadata": {"labels": ["a"]}, "spec": {}}, "metadata.labels"),
        ({"metadata": {"annotations": {"a": 1}}, "spec": {}}, "metadata.annotations"),
        ({"metadata": {}, "spec": {"containers": "app"}}, "spec.containers"),
        ({"metadata": {}, "spec": {"containers": [{"name": "c", "ports": [80]}]}}, "ports"),
        ({"metadata": "x", "spec": {}}, "metadata is not a mapping"),
        ({"metadata": {}, "spec": {"containers": [{"name": {}}]}}, "name must be a string"),
        (
            {"metadata": {}, "spec": {"containers": [{"name": "c", "securityContext": True}]}},
            "securityContext",
        ),
        (
            {
                "metadata": {},
                "spec": {"containers": [{"name": "istio-proxy", "volumeMounts": [{"mountPath": [1]}]}]},
            },
            "volumeMounts[].mountPath",
        ),
    ]
    for pod, message in cases:
        response = handle_inject(_review(pod), InjectConfig())["response"]
        assert response["allowed"] is False
        assert message in response["status"]["message"]


def test_bad_proxy_config_annotation_names_the_field() -> None:
    pod = _pod()
    pod["metadata"]["annotations"] = {"proxy.istio.io/config": "concurency: 2"}
    response = handle_inject(_review(pod), InjectConfig())["response"]
    assert response["allowed"] is False
    assert "proxy.istio.io/config" in response["status"]["message"]
    assert "concurency" in response["status"]["message"]


def test_handler_plugs_into_the_webhook_servers_review_path() -> None:
    from meshpilot.webhooks.admission import answer
    from meshpilot.webhooks.inject.review import InjectionHandler

    body = json.dumps(_review(_pod(), api="admission.k8s.io/v1beta1", uid="srv-1")).encode()
    out = json.loads(answer(body, InjectionHandler(InjectConfig())))
    assert out["apiVersion"] == "admission.k8s.io/v1beta1"
    assert out["response"]["uid"] == "srv-1"
    assert out["response"]["allowed"] is True
    assert out["response"]["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(out["response"]["patch"]))
    assert any(op["path"] == "/spec/initContainers" for op in patch)
