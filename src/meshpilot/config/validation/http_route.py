"""The HTTP routes of a VirtualService."""

from __future__ import annotations

from typing import Any

from meshpilot.config.validation import goparse, hosts, matches
from meshpilot.config.validation.formatting import go_fixed, go_quote
from meshpilot.config.validation.quantities import validate_duration, validate_percentage
from meshpilot.config.validation.report import Report
from meshpilot.config.validation.route_parts import (
    check_gateway_names,
    check_total_weight,
    check_weighted_destination,
    destination_errors,
)
from meshpilot.config.validation.selectors import label_map_errors

_CORS_METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "CONNECT", "OPTIONS", "TRACE", "*"}
)
_GRPC_STATUSES = frozenset(
    {
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    }
)
# Envoy's x-envoy-retry-on and x-envoy-retry-grpc-on policies.
_RETRY_ON_POLICIES = frozenset(
    {
        "5xx",
        "gateway-error",
        "reset",
        "reset-before-request",
        "connect-failure",
        "retriable-4xx",
        "refused-stream",
        "retriable-status-codes",
        "retriable-headers",
        "envoy-ratelimited",
        "http3-post-connect-failure",
        "cancelled",
        "deadline-exceeded",
        "internal",
        "resource-exhausted",
        "unavailable",
    }
)
# The status codes Go's net/http has a name for; istiod accepts exactly these as retryOn entries.
_KNOWN_STATUS_CODES = frozenset(
    {
        *range(100, 104),
        *range(200, 209),
        226,
        *range(300, 306),
        307,
        308,
        *range(400, 419),
        *range(421, 427),
        428,
        429,
        431,
        451,
        *range(500, 509),
        510,
        511,
    }
)
_MAX_DIRECT_RESPONSE = 1024 * 1024
_LARGE_DIRECT_RESPONSE = 100 * 1024


def _conflict_errors(route: Any, delegate_vs: bool) -> list[str]:
    """Which of route/redirect/directResponse/delegate may appear together."""
    errors = []
    if not delegate_vs and route.HasField("delegate"):
        # A root route hands everything to the delegate VirtualService.
        if route.HasField("redirect"):
            errors.append(f"root HTTP route {route.name} must not specify redirect")
        if route.route:
            errors.append(f"root HTTP route {route.name} must not specify route")
        return errors
    if delegate_vs and route.HasField("delegate"):
        errors.append("delegate HTTP route cannot contain delegate")
    if route.HasField("redirect"):
        if route.route:
            errors.append("HTTP route cannot contain both route and redirect")
        if route.HasField("fault"):
            errors.append("HTTP route cannot contain both fault and redirect")
        if route.HasField("rewrite"):
            errors.append("HTTP route rule cannot contain both rewrite and redirect")
        if route.HasField("direct_response"):
            errors.append("HTTP route rule cannot contain both direct_response and redirect")
    elif route.HasField("direct_response"):
        if route.route:
            errors.append("HTTP route cannot contain both route and direct_response")
        if route.HasField("fault"):
            errors.append("HTTP route cannot contain both fault and direct_response")
        if route.HasField("rewrite"):
            errors.append("HTTP route rule cannot contain both rewrite and direct_response")
    elif not route.route:
        errors.append("HTTP route, redirect or direct_response is required")
    if route.HasField("mirror") and route.mirrors:
        errors.append("HTTP route cannot contain both mirror and mirrors")
    return errors


def _check_match_requests(route: Any, report: Report) -> None:
    for match in route.match:
        for name, string_match in match.headers.items():
            report.check(matches.validate_header_name_or_jwt_claim(name))
            report.check(matches.validate_string_match(string_match, "headers"))
        for name, string_match in match.without_headers.items():
            report.check(matches.validate_header_name_or_jwt_claim(name))
            # A regex of "*" means "header present", and is not a regex at all.
            is_presence = string_match.WhichOneof("match_type") == "regex" and string_match.regex == "*"
            if not is_presence:
                report.check(matches.validate_string_match(string_match, "withoutHeaders"))
        # An empty URI prefix is fine (Envoy matches everything); not so for the others.
        report.check(matches.validate_string_match_regexp(match.uri, "uri"))
        report.check(matches.validate_string_match(match.scheme, "scheme"))
        report.check(matches.validate_string_match(match.method, "method"))
        report.check(matches.validate_string_match(match.authority, "authority"))
        for string_match in match.query_params.values():
            report.check(matches.validate_string_match(string_match, "queryParams"))
    for match in route.match:
        if match.port != 0:
            report.check(hosts.validate_port(match.port))
        report.errors.extend(label_map_errors(match.source_labels))
        # istiod drops the warnings about gateway names given in matches.
        scratch = Report()
        check_gateway_names(match.gateways, False, scratch)
        report.extend_errors(scratch)
        if match.source_namespace and not hosts.is_dns1123_label(match.source_namespace):
            report.error(f"sourceNamespace match {match.source_namespace} is invalid")


def header_operation_errors(headers: Any) -> list[str]:
    """Header manipulation on a route or a route destination."""
    errors: list[str | None] = []
    request, response = headers.request, headers.response
    for operations in (request.add, request.set):
        for name, value in operations.items():
            errors.append(matches.validate_header_with_authority_operation_name(name))
            errors.append(matches.validate_header_value(value))
    errors.extend(matches.validate_header_operation_name(name) for name in request.remove)
    for operations in (response.add, response.set):
        for name, value in operations.items():
            errors.append(matches.validate_header_operation_name(name))
            errors.append(matches.validate_header_value(value))
    errors.extend(matches.validate_header_operation_name(name) for name in response.remove)
    return [e for e in errors if e is not None]


def _cors_errors(policy: Any) -> list[str]:
    errors: list[str | None] = []
    # The deprecated allowOrigin list is not checked, only allowOrigins.
    for origin in policy.allow_origins:
        kind = origin.WhichOneof("match_type")
        value = getattr(origin, kind) if kind else ""
        if not value:
            errors.append(f"'{value}' is not a valid match type for CORS allow origins")
        else:
            errors.append(matches.validate_string_match_regexp(origin, "corsPolicy.allowOrigins"))
    for method in policy.allow_methods:
        if method not in _CORS_METHODS:
            errors.append(f"{go_quote(method)} is not a supported HTTP method")
    errors.extend(matches.validate_cors_header_name(name) for name in policy.allow_headers)
    errors.extend(matches.validate_cors_header_name(name) for name in policy.expose_headers)
    if policy.HasField("max_age"):
        errors.append(validate_duration(policy.max_age))
        if policy.max_age.nanos > 0:
            errors.append("max_age duration is accurate only to seconds precision")
    return [e for e in errors if e is not None]


def _http_status_error(status: int) -> str | None:
    # istiod's bound is 600 inclusive, whatever its message says.
    if status < 200 or status > 600:
        return f"HTTP status {status} is not in range 200-599"
    return None


def _fault_errors(fault: Any) -> list[str]:
    errors: list[str | None] = []
    if not fault.HasField("abort") and not fault.HasField("delay"):
        errors.append("HTTP fault injection must have an abort and/or a delay")
    if fault.HasField("abort"):
        abort = fault.abort
        if abort.HasField("percentage"):
            errors.append(validate_percentage(abort.percentage))
        kind = abort.WhichOneof("error_type")
        if kind == "grpc_status" and abort.grpc_status not in _GRPC_STATUSES:
            errors.append(
                f"gRPC status {go_quote(abort.grpc_status)} is not supported. See "
                "https://github.com/grpc/grpc/blob/master/doc/statuscodes.md for a list of supported codes, "
                "for example 'NOT_FOUND'"
            )
        elif kind == "http2_error":
            errors.append("HTTP/2 abort fault injection not supported yet")
        elif kind == "http_status":
            errors.append(_http_status_error(abort.http_status))
        # istiod's "abort configured, but error type not set" warning never surfaces: it is dropped.
    if fault.HasField("delay"):
        delay = fault.delay
        if delay.HasField("percentage"):
            errors.append(validate_percentage(delay.percentage))
        kind = delay.WhichOneof("http_delay_type")
        if kind == "fixed_delay":
            errors.append(validate_duration(delay.fixed_delay))
        elif kind == "exponential_delay":
            errors.append(validate_duration(delay.exponential_delay))
            errors.append("exponentialDelay not supported yet")
    return [e for e in errors if e is not None]


def _check_mirrors(route: Any, report: Report) -> None:
    if route.HasField("mirror_percent"):
        value = route.mirror_percent.value
        if value > 100:
            report.error(f"mirror_percent must have a max value of 100 (it has {value})")
        report.warn('using deprecated setting "mirrorPercent", use "mirrorPercentage" instead')
    if route.HasField("mirror_percentage"):
        value = route.mirror_percentage.value
        if value > 100:
            report.error(f"mirror_percentage must have a max value of 100 (it has {go_fixed(value)})")
        if value < 0:
            report.error(f"mirror_percentage must have a min value of 0 (it has {go_fixed(value)})")
    if route.HasField("mirror"):
        report.errors.extend(destination_errors(route.mirror))
    for mirror in route.mirrors:
        if not mirror.HasField("destination"):
            report.error("destination is required for mirrors")
            continue
        report.errors.extend(destination_errors(mirror.destination))
        if mirror.HasField("percentage"):
            value = mirror.percentage.value
            if value > 100:
                report.error(f"mirror percentage must have a max value of 100 (it has {go_fixed(value)})")
            if value < 0:
                report.error(f"mirror percentage must have a min value of 0 (it has {go_fixed(value)})")


def _redirect_error(redirect: Any) -> str | None:
    """The first problem of a redirect. (istiod 1.28 does not know prefixRewrite.)"""
    if not (redirect.uri or redirect.authority or redirect.WhichOneof("redirect_port") or redirect.scheme):
        return "redirect must specify URI, authority, scheme, or port"
    code = redirect.redirect_code
    if code != 0 and not 300 <= code <= 399:
        return f"{code} is not a valid redirect code, must be 3xx"
    if redirect.scheme not in ("", "http", "https"):
        return 'invalid redirect scheme, must be "http" or "https"'
    if redirect.port > 0:
        return hosts.validate_port(redirect.port)
    return None


def _check_direct_response(response: Any, report: Report) -> None:
    if response.HasField("body"):
        kind = response.body.WhichOneof("specifier")
        size = 0
        if kind == "string":
            size = len(response.body.string.encode())
        elif kind == "bytes":
            size = len(response.body.bytes)
        if size > _MAX_DIRECT_RESPONSE:
            report.error("large direct_responses may impact control plane performance, must be less than 1MB")
        elif size > _LARGE_DIRECT_RESPONSE:
            report.warn("large direct_responses may impact control plane performance")
    report.check(_http_status_error(response.status))


def _is_retry_on_policy(policy: str) -> bool:
    try:
        if goparse.atoi(policy) in _KNOWN_STATUS_CODES:
            return True
    except goparse.GoParseError:
        pass
    return policy in _RETRY_ON_POLICIES


def retry_errors(retries: Any) -> list[str]:
    """An HTTPRetry policy."""
    errors: list[str | None] = []
    if retries.attempts < 0:
        errors.append("attempts cannot be negative")
    configured = (
        retries.HasField("per_try_timeout") or retries.retry_on or retries.HasField("retry_remote_localities")
    )
    if retries.attempts == 0 and configured:
        errors.append("http retry policy configured when attempts are set to 0 (disabled)")
    if retries.HasField("per_try_timeout"):
        errors.append(validate_duration(retries.per_try_timeout))
    if retries.retry_on:
        # Entries are not trimmed: "5xx, reset" names the policy " reset".
        for policy in retries.retry_on.split(","):
            if not _is_retry_on_policy(policy):
                errors.append(f"{go_quote(policy)} is not a valid retryOn policy")
    if retries.HasField("backoff"):
        errors.append(validate_duration(retries.backoff))
    return [e for e in errors if e is not None]


def _rewrite_error(rewrite: Any) -> str | None:
    has_regex = rewrite.HasField("uri_regex_rewrite")
    if rewrite.uri and has_regex:
        return "rewrite may only contain one of URI or UriRegexRewrite"
    if not rewrite.uri and not has_regex and not rewrite.authority:
        return (
            "rewrite must specify at least one of URI, UriRegexRewrite, or authority. "
            "Only one of URI or UriRegexRewrite may be specified"
        )
    if has_regex:
        regex = rewrite.uri_regex_rewrite
        if not regex.match or not regex.rewrite:
            inner: str | None = "UriRegexRewrite requires both Rewrite and Match fields to be specified"
        else:
            inner = matches.validate_string_regexp(regex.match, "HTTPRewrite.UriRegexRewrite.Match")
        if inner:
            return f"UriRegexRewrite has errors\n{inner}"
    return None


def _authority_rewrite_error(route: Any) -> str | None:
    """The authority may be rewritten in only one place."""
    current = route.rewrite.authority
    request = route.headers.request
    for operations in (request.set, request.add):
        for name, value in operations.items():
            if not matches.is_authority_header(name):
                continue
            if current:
                return (
                    f"authority header cannot be set multiple times: have {go_quote(current)}, "
                    f"attempting to set {go_quote(value)}"
                )
            current = value
    return None


def check_http_route(route: Any, delegate_vs: bool, gateway_semantics: bool, report: Report) -> None:
    """One HTTP route. ``delegate_vs`` says whether the VirtualService is a delegate (has no hosts)."""
    report.errors.extend(_conflict_errors(route, delegate_vs))
    _check_match_requests(route, report)
    report.errors.extend(header_operation_errors(route.headers))
    if route.HasField("cors_policy"):
        report.errors.extend(_cors_errors(route.cors_policy))
    if route.HasField("fault"):
        report.errors.extend(_fault_errors(route.fault))
    _check_mirrors(route, report)
    if route.HasField("redirect"):
        report.check(_redirect_error(route.redirect))
    if route.HasField("direct_response"):
        _check_direct_response(route.direct_response, report)
    if route.HasField("retries"):
        report.errors.extend(retry_errors(route.retries))
    if route.HasField("rewrite"):
        report.check(_rewrite_error(route.rewrite))
    report.check(_authority_rewrite_error(route))
    for destination in route.route:
        report.errors.extend(header_operation_errors(destination.headers))
        check_weighted_destination(destination, gateway_semantics, report)
    check_total_weight(route.route, report)
    if route.HasField("timeout"):
        report.check(validate_duration(route.timeout))
