"""The ``/inject`` AdmissionReview exchange (istiod's webhook.go ``inject`` and ``serveInject``),
without HTTP: a decoded review in, the review to send back out."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

import jsonpatch
from prometheus_client import CollectorRegistry, Counter, Histogram

from meshpilot.webhooks.inject.config import InjectConfig, InjectionError
from meshpilot.webhooks.inject.inject import inject_pod

API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")


@dataclass(frozen=True)
class InjectionMetrics:
    requests: Counter
    success: Counter
    skip: Counter
    failure: Counter
    time: Histogram

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None) -> InjectionMetrics:
        """Counters named as istiod's; the server passes its own registry, tests a fresh one."""
        reg = registry if registry is not None else CollectorRegistry()
        # prometheus-client adds the "_total" suffix to counters itself.
        return cls(
            requests=Counter(
                "sidecar_injection_requests", "Total number of sidecar injection requests.", registry=reg
            ),
            success=Counter(
                "sidecar_injection_success",
                "Total number of successful sidecar injection requests.",
                registry=reg,
            ),
            skip=Counter(
                "sidecar_injection_skip", "Total number of skipped sidecar injection requests.", registry=reg
            ),
            failure=Counter(
                "sidecar_injection_failure",
                "Total number of failed sidecar injection requests.",
                registry=reg,
            ),
            time=Histogram(
                "sidecar_injection_time_seconds",
                "Total time taken for injection in seconds.",
                buckets=(0.1, 1, 3, 5, 10, 20, 30, 60),
                registry=reg,
            ),
        )


def create_patch(original: dict[str, Any], injected: dict[str, Any]) -> bytes:
    """The JSON Patch (RFC 6902) turning the pod Kubernetes sent into the injected pod."""
    return jsonpatch.make_patch(original, injected).to_string().encode()


def _response(review: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": review.get("apiVersion"), "kind": "AdmissionReview", "response": body}


def handle_inject(
    review: Any, config: InjectConfig, metrics: InjectionMetrics | None = None
) -> dict[str, Any]:
    """Answers one AdmissionReview: ``allowed: true`` with a JSONPatch when injecting, without one when
    skipping, and ``allowed: false`` with the reason when the request or the injection fails, as istiod
    does (the webhook's failurePolicy is Fail, so the pod is then refused)."""
    if metrics is None:
        return _handle_inject(review, config, None)
    # As istiod, every request's time is recorded, skips and failures included.
    with metrics.time.time():
        return _handle_inject(review, config, metrics)


def _handle_inject(review: Any, config: InjectConfig, metrics: InjectionMetrics | None) -> dict[str, Any]:
    if metrics is not None:
        metrics.requests.inc()
    if not isinstance(review, dict) or not isinstance(review.get("request"), dict):
        if metrics is not None:
            metrics.failure.inc()
        api = review.get("apiVersion") if isinstance(review, dict) else None
        return {
            "apiVersion": api or API_VERSIONS[0],
            "kind": "AdmissionReview",
            "response": {"allowed": False, "result": {"message": "AdmissionReview has no request"}},
        }
    request = review["request"]
    uid = request.get("uid", "")
    if review.get("apiVersion") not in API_VERSIONS:
        if metrics is not None:
            metrics.failure.inc()
        message = f"unsupported AdmissionReview apiVersion {review.get('apiVersion')!r}"
        return _response(review, {"uid": uid, "allowed": False, "result": {"message": message}})
    pod = request.get("object")
    try:
        if not isinstance(pod, dict):
            raise InjectionError("request.object is not a pod")
        injected = inject_pod(pod, str(request.get("namespace") or ""), config)
    except InjectionError as err:
        if metrics is not None:
            metrics.failure.inc()
        return _response(review, {"uid": uid, "allowed": False, "result": {"message": str(err)}})
    if injected is None:
        if metrics is not None:
            metrics.skip.inc()
        return _response(review, {"uid": uid, "allowed": True})
    # istiod diffs against the pod without managedFields, as inject_pod drops them.
    original = json.loads(json.dumps(pod))
    if isinstance(original.get("metadata"), dict):
        original["metadata"].pop("managedFields", None)
    patch = create_patch(original, injected)
    if metrics is not None:
        metrics.success.inc()
    return _response(
        review,
        {"uid": uid, "allowed": True, "patchType": "JSONPatch", "patch": base64.b64encode(patch).decode()},
    )


class InjectionHandler:
    """``handle_inject`` as the webhook server's ``ReviewHandler`` (a review's ``request`` in, its
    ``response`` out), for ``WebhookServer.add_review_handler("/inject", ...)``; the server decodes
    the envelope and answers in the caller's apiVersion."""

    def __init__(self, config: InjectConfig, metrics: InjectionMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        review = {"apiVersion": API_VERSIONS[0], "kind": "AdmissionReview", "request": request}
        response: dict[str, Any] = handle_inject(review, self.config, self.metrics)["response"]
        return response
