"""The ``/inject`` AdmissionReview exchange (istiod's webhook.go ``inject`` and ``serveInject``),
without HTTP: a decoded review in, the review to send back out."""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jsonpatch
import orjson
from prometheus_client import CollectorRegistry, Counter, Histogram

from meshpilot.input_limits import InputRejected
from meshpilot.webhooks.admission import answer, denied
from meshpilot.webhooks.inject.config import InjectConfig, InjectionError
from meshpilot.webhooks.inject.inject import inject_pod


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


def handle_inject(
    review: Any, config: InjectConfig, metrics: InjectionMetrics | None = None, mesh: Any | None = None
) -> dict[str, Any]:
    """A whole AdmissionReview answered as the webhook server answers it (one envelope path:
    ``admission.answer``), for callers holding a decoded review."""
    handler = InjectionHandler(config, metrics, lambda: mesh)
    answered: dict[str, Any] = orjson.loads(answer(orjson.dumps(review), handler))
    return answered


class InjectionHandler:
    """The webhook server's ``ReviewHandler`` for ``/inject``: a review's ``request`` in, its
    ``response`` out (the server decodes the envelope and answers in the caller's apiVersion).

    ``allowed: true`` with a JSONPatch when injecting, without one when skipping, and ``allowed:
    false`` with the reason when the injection fails, as istiod does (the webhook's failurePolicy
    is Fail, so the pod is then refused).
    """

    def __init__(
        self,
        config: InjectConfig,
        metrics: InjectionMetrics | None = None,
        mesh: Callable[[], Any] | None = None,
    ) -> None:
        self.config = config
        # Read per request, so a MeshConfig change reaches the next pod as it does in istiod.
        self.mesh = mesh or (lambda: None)
        # Without the server's registry (tests, kube-inject), counters go to a registry of their own.
        self.metrics = metrics or InjectionMetrics.create()

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        # As istiod, every request is counted and timed, skips and failures included.
        self.metrics.requests.inc()
        with self.metrics.time.time():
            response = self._respond(request)
        if not response["allowed"]:
            self.metrics.failure.inc()
        elif "patch" in response:
            self.metrics.success.inc()
        else:
            self.metrics.skip.inc()
        return response

    def _respond(self, request: dict[str, Any]) -> dict[str, Any]:
        pod = request.get("object")
        try:
            if not isinstance(pod, dict):
                raise InjectionError("request.object is not a pod")
            injected = inject_pod(pod, str(request.get("namespace") or ""), self.config, mesh=self.mesh())
        except (InjectionError, InputRejected) as err:
            return denied(str(err))
        if injected is None:
            return {"allowed": True}
        # istiod diffs against the pod without managedFields, as inject_pod drops them.
        meta = pod.get("metadata")
        original = pod
        if isinstance(meta, dict) and "managedFields" in meta:
            original = {**pod, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
        patch = base64.b64encode(create_patch(original, injected)).decode()
        return {"allowed": True, "patchType": "JSONPatch", "patch": patch}
