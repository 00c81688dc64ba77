"""The values inside AuthorizationPolicy rules: IPs, ports, service accounts, paths, conditions.

``trustDomains`` and the ``source.trustDomain`` condition are checked as the reference istiod (1.31)
checks them; istiod 1.28 did not know them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from meshpilot.config.validation import goparse
from meshpilot.config.validation.formatting import go_quote

_MATCH_ONE = "{*}"
_MATCH_ANY = "{**}"
# RFC 3986 pchar, what Envoy accepts in a path template segment.
_PATH_LITERAL = re.compile(r"[a-zA-Z0-9-._~%!$&'()+,;:@=]+")


def ip_errors(values: Sequence[str]) -> list[str]:
    """IP addresses or CIDR blocks (ipBlocks and the ``*.ip`` conditions)."""
    errors = []
    for value in values:
        if "/" in value:
            try:
                goparse.parse_prefix(value)
            except goparse.GoParseError as err:
                errors.append(f"bad CIDR range ({value}): {err}")
        elif not goparse.is_ip_address(value):
            errors.append(f"bad IP address ({value})")
    return errors


def port_errors(values: Sequence[str]) -> list[str]:
    """Port numbers written as strings; 0 is accepted."""
    errors = []
    for value in values:
        try:
            number = goparse.parse_uint32(value)
        except goparse.GoParseError as err:
            errors.append(f"bad port ({value}): {err}")
            continue
        if number > 65535:
            # istiod formats the (nil) parse error into this message.
            errors.append(f"bad port ({value}): <nil>")
    return errors


def empty_value_error(key: str, values: Sequence[str]) -> str | None:
    """No empty strings in a list."""
    if any(value == "" for value in values):
        return f"empty value not allowed, found in {key}"
    return None


def wildcard_error(key: str, values: Sequence[str]) -> str | None:
    """Non-empty values with at most one wildcard, at the start or the end."""
    error = empty_value_error(key, values)
    if error:
        return error
    for value in values:
        count = value.count("*")
        if count > 1:
            return f"at most one wildcard is allowed, found in {key}: {_go_quote(value)}"
        if count == 1 and value != "*" and not value.startswith("*") and not value.endswith("*"):
            return f"wildcard is only allowed at the start or end, found in {key}: {_go_quote(value)}"
    return None


def _go_quote(value: str) -> str:
    """Go's %q of a plain string."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def trust_domain_error(key: str, values: Sequence[str]) -> str | None:
    """Wildcard values without ``/`` (istiod's CheckTrustDomainValues)."""
    error = wildcard_error(key, values)
    if error:
        return error
    for value in values:
        if "/" in value:
            return f"trust domain must not contain '/', found in {key}: {_go_quote(value)}"
    return None


def service_account_error(key: str, values: Sequence[str]) -> str | None:
    """``serviceAccount`` or ``namespace/serviceAccount`` values, without wildcards."""
    if len(values) > 16:
        return "may not have more than 16 values"
    expected = "expected format 'serviceAccount' or 'namespace/serviceAccount', found"
    for value in values:
        if value == "":
            return f"empty value not allowed, found in {key}"
        if "*" in value:
            return f"wildcard not allowed, found in {key}"
        if value.count("/") > 1:
            return f"{expected} {go_quote(value)} in {key}"
        if len(value) > 320:
            return f"value cannot exceed 320 characters, found {go_quote(value)} in {key}"
        namespace, slash, account = value.partition("/")
        if slash and not namespace:
            return f"{expected} empty namespace {go_quote(value)} in {key}"
        if slash and not account:
            return f"{expected} empty serviceAccount {go_quote(value)} in {key}"
    return None


def path_template_error(key: str, paths: Sequence[str]) -> str | None:
    """Path templates: ``{*}`` segments, then at most one ``{**}`` as the last operator."""
    for raw in paths:
        has_template = _MATCH_ONE in raw or _MATCH_ANY in raw
        path = raw.strip("/")
        seen_any = False
        for segment in path.split("/"):
            if segment in (_MATCH_ONE, _MATCH_ANY):
                if seen_any:
                    return (
                        f"invalid or unsupported path {path}, found in {key}. {{**}} is not the last operator"
                    )
                seen_any = segment == _MATCH_ANY
                continue
            if "{" in segment or "}" in segment:
                return (
                    f"invalid or unsupported path {path}, found in {key}. "
                    "Contains '{' or '}' beyond a supported path template"
                )
            if has_template and _PATH_LITERAL.fullmatch(segment) is None:
                return (
                    f"invalid or unsupported path {path}, found in {key}. "
                    f"Contains segment {segment} with invalid string literal"
                )
    return None


def _map_key_error(key: str) -> str | None:
    """Keys such as ``request.headers[X-Foo]``: a non-empty name in brackets at the end."""
    open_at = key.find("[")
    if key.endswith("]") and 0 < open_at < len(key) - 2:
        return None
    return f"bad key ({key}): should have format a[b]"


# Condition keys whose values are not checked further.
_FREE_FORM_KEYS = frozenset(
    {
        "source.namespace",
        "source.principal",
        "request.auth.principal",
        "request.auth.audiences",
        "request.auth.presenter",
        "connection.sni",
    }
)
_IP_KEYS = frozenset({"source.ip", "remote.ip", "destination.ip"})


def attribute_error(key: str, values: Sequence[str]) -> str | None:
    """A ``when`` condition: a known key, and values of the right kind for it."""
    problem = empty_value_error(key, values)
    if problem:
        return problem
    if key.startswith("request.headers"):
        return _map_key_error(key)
    if key in _IP_KEYS:
        errors = ip_errors(values)
        return "; ".join(errors) if errors else None
    if key in _FREE_FORM_KEYS:
        return None
    if key == "source.serviceAccount":
        return service_account_error(key, values)
    if key == "source.trustDomain":
        return wildcard_error(key, values)
    if key.startswith("request.auth.claims"):
        return _map_key_error(key)
    if key == "destination.port":
        errors = port_errors(values)
        return "; ".join(errors) if errors else None
    if key.startswith("experimental.envoy.filters."):
        return _map_key_error(key)
    if key == "destination.namespace":
        return f"attribute {key} is replaced by the metadata.namespace"
    if key.startswith("destination.labels"):
        return f"attribute {key} is replaced by the workload selector"
    if key in ("destination.name", "destination.user"):
        return f"deprecated attribute {key}: only supported in v1alpha1"
    return f"unknown attribute: {key}"
