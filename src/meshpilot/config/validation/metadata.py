"""Checks on every object's metadata.

Two layers, in the order a Kubernetes cluster applies them:

* ObjectMeta rules that kube-apiserver enforces before istiod ever sees an
  object (name, namespace, label and annotation syntax). Objects read from
  files skip the API server, so meshpilot applies them itself; when they fail,
  nothing else is checked, as the API server would have refused the object.
* istiod's own metadata checks (the ``istio.io/dry-run`` annotation and the
  internal annotations users may not set). istiod stops at the first failure,
  and then the kind's validator does not run either.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from meshpilot.config.validation import goparse
from meshpilot.config.validation.formatting import enum_name, go_quote
from meshpilot.config.validation.report import Report
from meshpilot.model.config import Config
from meshpilot.model.kind import Kind

DRY_RUN_ANNOTATION = "istio.io/dry-run"
_ALWAYS_REJECT = "internal.istio.io/webhook-always-reject"
_FORBIDDEN_ANNOTATIONS = ("internal.istio.io/parent-namespace", "internal.istio.io/parents")

_K8S_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_K8S_SUBDOMAIN = rf"{_K8S_LABEL}(\.{_K8S_LABEL})*"
_K8S_QUALIFIED_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_K8S_LABEL_VALUE = rf"({_K8S_QUALIFIED_NAME})?"
_MAX_ANNOTATIONS_BYTES = 256 * 1024

_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character (e.g. 'example.com', "
    f"regex used for validation is '{_K8S_SUBDOMAIN}')"
)
_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', "
    f"regex used for validation is '{_K8S_LABEL}')"
)
_NAME_PART_MSG = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
    "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', "
    f"regex used for validation is '{_K8S_QUALIFIED_NAME}')"
)
_QUALIFIED_NAME_MSG = (
    "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
    "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', "
    f"regex used for validation is '{_K8S_QUALIFIED_NAME}') with an optional DNS subdomain prefix "
    "and '/' (e.g. 'example.com/MyName')"
)
_LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', "
    f"regex used for validation is '{_K8S_LABEL_VALUE}')"
)


def _subdomain_problems(value: str) -> list[str]:
    problems = []
    if len(value) > 253:
        problems.append("must be no more than 253 characters")
    if re.fullmatch(_K8S_SUBDOMAIN, value) is None:
        problems.append(_SUBDOMAIN_MSG)
    return problems


def _label_problems(value: str) -> list[str]:
    problems = []
    if len(value) > 63:
        problems.append("must be no more than 63 characters")
    if re.fullmatch(_K8S_LABEL, value) is None:
        problems.append(_LABEL_MSG)
    return problems


def _qualified_name_problems(value: str) -> list[str]:
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
        problems = []
    elif len(parts) == 2:
        prefix, name = parts
        if prefix:
            problems = ["prefix part " + p for p in _subdomain_problems(prefix)]
        else:
            problems = ["prefix part must be non-empty"]
    else:
        return [_QUALIFIED_NAME_MSG]
    if not name:
        problems.append("name part must be non-empty")
    elif len(name) > 63:
        problems.append("name part must be no more than 63 characters")
    if name and re.fullmatch(_K8S_QUALIFIED_NAME, name) is None:
        problems.append(_NAME_PART_MSG)
    return problems


def _invalid(field: str, value: str, problem: str) -> str:
    return f"{field}: Invalid value: {go_quote(value)}: {problem}"


def _object_meta_errors(config: Config) -> list[str]:
    """What kube-apiserver would refuse in the object's metadata."""
    meta = config.meta
    errors = []
    if not meta.name:
        errors.append("metadata.name: Required value: name or generateName is required")
    else:
        errors.extend(_invalid("metadata.name", meta.name, p) for p in _subdomain_problems(meta.name))
    if meta.namespace:
        errors.extend(
            _invalid("metadata.namespace", meta.namespace, p) for p in _label_problems(meta.namespace)
        )
    errors.extend(_label_errors(meta.labels))
    errors.extend(_annotation_errors(meta.annotations))
    return errors


def _label_errors(labels: Mapping[str, str]) -> list[str]:
    errors: list[str] = []
    for key, value in labels.items():
        errors.extend(_invalid("metadata.labels", key, p) for p in _qualified_name_problems(key))
        if len(value) > 63:
            errors.append(_invalid("metadata.labels", value, "must be no more than 63 characters"))
        if re.fullmatch(_K8S_LABEL_VALUE, value) is None:
            errors.append(_invalid("metadata.labels", value, _LABEL_VALUE_MSG))
    return errors


def _annotation_errors(annotations: Mapping[str, str]) -> list[str]:
    errors: list[str] = []
    total = 0
    for key, value in annotations.items():
        # Kubernetes checks annotation keys in lower case.
        errors.extend(_invalid("metadata.annotations", key, p) for p in _qualified_name_problems(key.lower()))
        total += len(key.encode()) + len(value.encode())
    if total > _MAX_ANNOTATIONS_BYTES:
        errors.append(f"metadata.annotations: Too long: must have at most {_MAX_ANNOTATIONS_BYTES} bytes")
    return errors


def _dry_run_error(config: Config) -> str | None:
    value = config.meta.annotations.get(DRY_RUN_ANNOTATION)
    if value is None:
        return None
    ns, name = config.meta.namespace, config.meta.name
    if config.kind is not Kind.AUTHORIZATION_POLICY:
        return f"{ns}/{name} has unsupported annotation {DRY_RUN_ANNOTATION}, please remove the annotation"
    action = enum_name(config.spec, "action")
    if action not in ("ALLOW", "DENY"):
        return (
            f"the annotation {DRY_RUN_ANNOTATION} currently only supports action ALLOW/DENY, "
            f"found action {action} in {ns}/{name}"
        )
    try:
        goparse.parse_bool(value)
    except goparse.GoParseError as err:
        return f"{ns}/{name} has annotation {DRY_RUN_ANNOTATION} with invalid value ({value}): {err}"
    return None


def _istio_metadata_error(config: Config) -> str | None:
    annotations = config.meta.annotations
    problem = _dry_run_error(config)
    if problem:
        return problem
    if _ALWAYS_REJECT in annotations:
        return f"{go_quote(_ALWAYS_REJECT)} annotation found, rejecting"
    for name in _FORBIDDEN_ANNOTATIONS:
        # These internal annotations widen what a config may affect; users may not set them.
        if name in annotations:
            return f"{go_quote(name)} annotation found, this may not be set by users"
    return None


def validate_metadata(config: Config, report: Report) -> None:
    """Record the metadata errors. When there are any, the kind's own checks must not run."""
    meta_errors = _object_meta_errors(config)
    if meta_errors:
        report.errors.extend(meta_errors)
        return
    report.check(_istio_metadata_error(config))
