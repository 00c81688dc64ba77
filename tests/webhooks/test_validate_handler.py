"""The ``/validate`` handler on its own: istiod's messages, and what its metrics count."""

from __future__ import annotations

from typing import Any

from meshpilot.server.metrics import Metrics
from meshpilot.webhooks.validate import ValidationHandler, go_multierror

RESOURCE = {"group": "networking.istio.io", "version": "v1", "resource": "virtualservices"}


def vs(api_version: str = "networking.istio.io/v1", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": "VirtualService",
        "metadata": {"name": "x", "namespace": "ns"},
        "spec": {"hosts": ["reviews"], **spec},
    }


def two_bad_weights() -> dict[str, Any]:
    route = [{"destination": {"host": "a"}, "weight": -5}, {"destination": {"host": "b"}, "weight": -3}]
    return vs(http=[{"route": route}])


def failed(metrics: Metrics, reason: str) -> float:
    value = metrics.registry.get_sample_value(
        "galley_validation_failed_total", {**RESOURCE, "reason": reason}
    )
    return value or 0.0


def call(handler: ValidationHandler, obj: Any, operation: str = "CREATE", **extra: Any) -> dict[str, Any]:
    return handler({"operation": operation, "resource": RESOURCE, "namespace": "ns", "object": obj, **extra})


def test_several_errors_read_as_go_multierror() -> None:
    handler = ValidationHandler(Metrics())
    response = call(handler, two_bad_weights())
    assert response == {
        "allowed": False,
        "status": {
            "message": "configuration is invalid: 2 errors occurred:\n"
            "\t* weight -5 < 0\n\t* weight -3 < 0\n\n"
        },
    }
    assert go_multierror(["only"]) == "1 error occurred:\n\t* only\n\n"


def test_version_is_ignored_as_istiod_ignores_it() -> None:
    handler = ValidationHandler(Metrics())
    # A version meshpilot does not know still validates against the kind's one schema.
    assert call(handler, two_bad_weights() | {"apiVersion": "networking.istio.io/v9"})["allowed"] is False
    good = vs("networking.istio.io/v9", tcp=[{"route": [{"destination": {"host": "a"}}]}])
    assert call(handler, good) == {"allowed": True}


def test_reasons_counted_with_istiod_labels() -> None:
    metrics = Metrics()
    handler = ValidationHandler(metrics)
    call(handler, two_bad_weights())
    call(handler, vs(hosts="not-a-list"))
    call(handler, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}})
    call(handler, [1])
    call(handler, vs() | {"kind": 5})
    call(handler, two_bad_weights(), operation="DELETE")
    assert failed(metrics, "invalid_resource") == 1
    assert failed(metrics, "crd_conversion_error") == 1
    assert failed(metrics, "unknown_type") == 1
    assert failed(metrics, "yaml_decode_error") == 2
    assert failed(metrics, "unsupported_operation") == 1
    assert call(handler, vs(hosts="x"))["status"]["message"].startswith(
        "error decoding configuration: spec.hosts"
    )


def test_dry_runs_are_not_counted_as_failures() -> None:
    metrics = Metrics()
    handler = ValidationHandler(metrics)
    assert call(handler, two_bad_weights(), dryRun=True)["allowed"] is False
    assert failed(metrics, "invalid_resource") == 0
