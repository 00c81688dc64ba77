"""``/validate``: istiod's validating admission webhook for Istio config.

The same decoding and validation as the config directory loader
(``decode_object``), so an object the webhook admits is one the loader
accepts, and messages read as istiod's
(pkg/webhooks/validation/server/server.go).
"""

from __future__ import annotations

import logging
from typing import Any

from meshpilot.bounded_logs import DETAIL_CHARS, clip
from meshpilot.config.decode import decode_object
from meshpilot.config.errors import ConfigError, ValidationError
from meshpilot.config.schemas import SCHEMAS, Schema
from meshpilot.metric_labels import admission_resource
from meshpilot.server.metrics import Metrics
from meshpilot.webhooks.admission import denied

log = logging.getLogger(__name__)

# Reasons of galley_validation_failed, as istiod names them.
REASON_UNSUPPORTED_OPERATION = "unsupported_operation"
REASON_YAML_DECODE_ERROR = "yaml_decode_error"
REASON_UNKNOWN_TYPE = "unknown_type"
REASON_CRD_CONVERSION_ERROR = "crd_conversion_error"
REASON_INVALID_CONFIG = "invalid_resource"

#: The only top-level fields istiod admits on an Istio object.
_VALID_FIELDS = frozenset({"apiVersion", "kind", "metadata", "spec", "status"})

#: Istio kinds by (group, kind): istiod ignores the version, so a newer version still validates.
_ISTIO_BY_GROUP_KIND = {(s.group, s.kind.value): s for s in SCHEMAS.values() if s.kind.is_istio}


def go_multierror(errors: list[str]) -> str:
    """How istiod's validation errors read: hashicorp/go-multierror's list format."""
    if len(errors) == 1:
        return f"1 error occurred:\n\t* {errors[0]}\n\n"
    points = "\n\t".join(f"* {e}" for e in errors)
    return f"{len(errors)} errors occurred:\n\t{points}\n\n"


def _text(data: Any, key: str) -> str:
    value = data.get(key) if isinstance(data, dict) else None
    return value if isinstance(value, str) else ""


class ValidationHandler:
    """The ``/validate`` review handler, counting outcomes in istiod's metrics."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        resource = request.get("resource")
        # Label values are the caller's to choose: mapped onto Istio's resources, else "other".
        labels = admission_resource(
            _text(resource, "group"), _text(resource, "version"), _text(resource, "resource")
        )
        # istiod counts nothing for dry runs (kubectl --dry-run=server).
        dry_run = request.get("dryRun") is True
        suffix = " (dry run)" if dry_run else ""

        def fail(reason: str, message: str) -> dict[str, Any]:
            if not dry_run:
                self.metrics.validation_failed.labels(*labels, reason).inc()
            log.info("%s%s", clip(message, DETAIL_CHARS), suffix)
            return denied(message)

        operation = request.get("operation")
        if operation not in ("CREATE", "UPDATE"):
            if not dry_run:
                self.metrics.validation_failed.labels(*labels, REASON_UNSUPPORTED_OPERATION).inc()
            return {"allowed": True}
        obj = request.get("object")
        if not isinstance(obj, dict):
            return fail(
                REASON_YAML_DECODE_ERROR, "cannot decode configuration: the object is not a JSON object"
            )
        for key in ("apiVersion", "kind"):
            if key in obj and not isinstance(obj[key], str):
                return fail(REASON_YAML_DECODE_ERROR, f"cannot decode configuration: {key} must be a string")
        api_version, kind = _text(obj, "apiVersion"), _text(obj, "kind")
        group, _, version = api_version.rpartition("/")
        schema = _ISTIO_BY_GROUP_KIND.get((group, kind))
        if schema is None:
            # Go prints a GroupVersionKind as "group/version, Kind=kind".
            return fail(REASON_UNKNOWN_TYPE, f"unrecognized type {group}/{version}, Kind={kind}")
        namespace = _text(request, "namespace") or "default"
        try:
            result = decode_object(_at_known_version(obj, schema), default_namespace=namespace)
        except ValidationError as err:
            return fail(REASON_INVALID_CONFIG, f"configuration is invalid: {go_multierror(err.errors)}")
        except ConfigError as err:
            return fail(REASON_CRD_CONVERSION_ERROR, f"error decoding configuration: {err}")
        unknown = sorted(set(obj) - _VALID_FIELDS)
        if unknown:
            request_kind = _text(request.get("kind"), "kind")
            where = f"{_text(request, 'namespace')}/{_text(obj.get('metadata'), 'name')}"
            return fail(
                REASON_INVALID_CONFIG, f'unknown field "{unknown[0]}" on {request_kind} resource {where}'
            )
        self.metrics.validation_passed.labels(*labels).inc()
        response: dict[str, Any] = {"allowed": True}
        if result.warnings:
            response["warnings"] = list(result.warnings)
        return response


def _at_known_version(obj: dict[str, Any], schema: Schema) -> dict[str, Any]:
    """``obj`` under an apiVersion the decoder accepts; every version of a kind shares one schema."""
    version = _text(obj, "apiVersion").rpartition("/")[2]
    if version in schema.versions:
        return obj
    return {**obj, "apiVersion": schema.api_version}
