"""PeerAuthentication, AuthorizationPolicy and RequestAuthentication."""

from __future__ import annotations

from typing import Any

from meshpilot._proto.istio.security.v1beta1 import authorization_policy_pb2
from meshpilot.config.validation import authz_values, matches
from meshpilot.config.validation.formatting import enum_name
from meshpilot.config.validation.jwt import jwks_error, jwks_uri_error
from meshpilot.config.validation.quantities import validate_duration
from meshpilot.config.validation.registry import register
from meshpilot.config.validation.report import Report
from meshpilot.config.validation.selectors import check_policy_targets, check_workload_selector
from meshpilot.model.config import Config
from meshpilot.model.kind import Kind

_AP = authorization_policy_pb2.AuthorizationPolicy


@register(Kind.PEER_AUTHENTICATION)
def validate_peer_authentication(config: Config, report: Report) -> None:
    """A PeerAuthentication: port-level mTLS needs a workload selector and real ports.

    (istiod also rejects ``portLevelMtls: {}``; after decoding an empty map
    cannot be told from an absent one, so that case is accepted here.)
    """
    pa = config.spec
    no_selector = not pa.HasField("selector") or not pa.selector.match_labels
    if no_selector and pa.port_level_mtls:
        report.error("mesh/namespace peer authentication cannot have port level mTLS")
    for port in pa.port_level_mtls:
        if not 1 <= port <= 65535:
            report.error("port must be in range 1..65535")
    check_workload_selector(pa, "selector", report)


# Source fields, in the capitalized form istiod names them in messages.
_SOURCE_FIELDS = (
    ("principals", "Principals"),
    ("request_principals", "RequestPrincipals"),
    ("namespaces", "Namespaces"),
    ("ip_blocks", "IpBlocks"),
    ("remote_ip_blocks", "RemoteIpBlocks"),
    ("not_principals", "NotPrincipals"),
    ("not_request_principals", "NotRequestPrincipals"),
    ("not_namespaces", "NotNamespaces"),
    ("not_ip_blocks", "NotIpBlocks"),
    ("not_remote_ip_blocks", "NotRemoteIpBlocks"),
    ("service_accounts", "ServiceAccounts"),
    ("not_service_accounts", "NotServiceAccounts"),
    ("trust_domains", "TrustDomains"),
    ("not_trust_domains", "NotTrustDomains"),
)
# Source fields an external authorizer (CUSTOM) cannot be told about.
_CUSTOM_UNSUPPORTED_SOURCE = (
    "namespaces",
    "not_namespaces",
    "service_accounts",
    "not_service_accounts",
    "trust_domains",
    "not_trust_domains",
    "principals",
    "not_principals",
    "request_principals",
    "not_request_principals",
)
_CUSTOM_UNSUPPORTED_KEYS = frozenset({"source.namespace", "source.serviceAccount", "source.principal"})
# Source fields that only make sense for TCP too (so a DENY rule with them is not HTTP-only).
_TCP_SOURCE_FIELDS = (
    "principals",
    "not_principals",
    "ip_blocks",
    "not_ip_blocks",
    "namespaces",
    "not_namespaces",
    "remote_ip_blocks",
    "not_remote_ip_blocks",
    "service_accounts",
    "not_service_accounts",
)
_OPERATION_FIELDS = (
    ("ports", "Ports"),
    ("methods", "Methods"),
    ("paths", "Paths"),
    ("hosts", "Hosts"),
    ("not_ports", "NotPorts"),
    ("not_methods", "NotMethods"),
    ("not_paths", "NotPaths"),
    ("not_hosts", "NotHosts"),
)
_MEANINGLESS = (
    "{} action without `rules` is meaningless as it will never be triggered, "
    "add an empty rule `{{}}` if you want it be triggered for every request"
)
_DENY_ALL_TCP_WARNING = (
    "configured AuthorizationPolicy will deny all traffic to TCP ports under its scope due to the use "
    "of only HTTP attributes in a DENY rule; it is recommended to explicitly specify the port"
)


def _camel(field: str) -> str:
    return "".join(part.capitalize() for part in field.split("_"))


def _check_custom(policy: Any, report: Report) -> None:
    if not policy.rules:
        report.error(_MEANINGLESS.format("CUSTOM"))
    elif not policy.HasField("provider") or not policy.provider.name:
        report.error("`provider.name` must not be empty")
    for rule in policy.rules:
        for source_rule in getattr(rule, "from"):
            if not source_rule.HasField("source"):
                continue
            for field in _CUSTOM_UNSUPPORTED_SOURCE:
                if getattr(source_rule.source, field):
                    report.error(f"From.{_camel(field)} is currently not supported with CUSTOM action")
        for condition in rule.when:
            key = condition.key
            if key in _CUSTOM_UNSUPPORTED_KEYS or key.startswith("request.auth."):
                report.error(f"{key} is currently not supported with CUSTOM action")


def _check_source(source: Any, index: int, report: Report) -> None:
    lists = {field: list(getattr(source, field)) for field, _ in _SOURCE_FIELDS}
    identities = (
        lists["principals"] or lists["not_principals"] or lists["namespaces"] or lists["not_namespaces"]
    )
    if identities and (lists["service_accounts"] or lists["not_service_accounts"]):
        report.error(f"cannot set serviceAccounts with namespaces or principals, found at rule {index}")
    if not any(lists.values()):
        report.error(f"`from.source` must not be empty, found at rule {index}")
    for field in ("ip_blocks", "not_ip_blocks", "remote_ip_blocks", "not_remote_ip_blocks"):
        report.errors.extend(authz_values.ip_errors(lists[field]))
    for field, name in _SOURCE_FIELDS:
        if field.endswith("service_accounts"):
            report.check(authz_values.service_account_error(name, lists[field]))
        elif field.endswith("trust_domains"):
            report.check(authz_values.trust_domain_error(name, lists[field]))
        else:
            report.check(authz_values.empty_value_error(name, lists[field]))


def _check_operation(operation: Any, index: int, report: Report) -> None:
    lists = {field: list(getattr(operation, field)) for field, _ in _OPERATION_FIELDS}
    if not any(lists.values()):
        report.error(f"`to.operation` must not be empty, found at rule {index}")
    report.errors.extend(authz_values.port_errors(lists["ports"]))
    report.errors.extend(authz_values.port_errors(lists["not_ports"]))
    for field, name in _OPERATION_FIELDS:
        report.check(authz_values.empty_value_error(name, lists[field]))
    report.check(authz_values.path_template_error("Paths", lists["paths"]))
    report.check(authz_values.path_template_error("NotPaths", lists["not_paths"]))


def _check_conditions(rule: Any, report: Report) -> None:
    for condition in rule.when:
        key = condition.key
        if not key:
            report.error("`key` must not be empty")
            continue
        if not condition.values and not condition.not_values:
            report.error(f"at least one of `values` or `notValues` must be set for key {key}")
            continue
        # Both lists are checked even when one is empty, so a bad key is reported twice.
        problem = authz_values.attribute_error(key, condition.values)
        if problem:
            report.error(f"invalid `value` for `key` {key}: {problem}")
        problem = authz_values.attribute_error(key, condition.not_values)
        if problem:
            report.error(f"invalid `notValue` for `key` {key}: {problem}")


def _check_rule(rule: Any, index: int, is_deny: bool, report: Report) -> None:
    from_exists = to_exists = tcp_in_from = tcp_in_to = False
    for source_rule in getattr(rule, "from"):
        if not source_rule.HasField("source"):
            report.error(f"`from.source` must not be nil, found at rule {index}")
            continue
        from_exists = True
        _check_source(source_rule.source, index, report)
        tcp_in_from = tcp_in_from or any(getattr(source_rule.source, f) for f in _TCP_SOURCE_FIELDS)
    for target in rule.to:
        if not target.HasField("operation"):
            report.error(f"`to.operation` must not be nil, found at rule {index}")
            continue
        to_exists = True
        _check_operation(target.operation, index, report)
        tcp_in_to = tcp_in_to or bool(target.operation.ports or target.operation.not_ports)
    _check_conditions(rule, report)
    # A DENY rule that only names HTTP attributes cannot match TCP traffic, which
    # Envoy then denies outright.
    http_only = (from_exists and not to_exists and not tcp_in_from) or (to_exists and not tcp_in_to)
    if is_deny and http_only:
        report.warn(_DENY_ALL_TCP_WARNING)


@register(Kind.AUTHORIZATION_POLICY)
def validate_authorization_policy(config: Config, report: Report) -> None:
    """An AuthorizationPolicy. Every error is prefixed with ``invalid policy <name>.<namespace>:``."""
    policy = config.spec
    found = Report()
    check_policy_targets(policy, found)
    if policy.action == _AP.CUSTOM:
        _check_custom(policy, found)
    if policy.HasField("provider") and policy.action != _AP.CUSTOM:
        found.error(f"`provider` must not be with non CUSTOM action, found {enum_name(policy, 'action')}")
    if policy.action == _AP.DENY and not policy.rules:
        found.error(_MEANINGLESS.format("DENY"))
    for index, rule in enumerate(policy.rules):
        _check_rule(rule, index, policy.action == _AP.DENY, found)
    prefix = f"invalid policy {config.meta.name}.{config.meta.namespace}:"
    report.errors.extend(f"{prefix} {error}" for error in found.errors)
    report.warnings.extend(found.warnings)


def _jwt_rule_errors(rule: Any) -> list[str]:
    errors: list[str | None] = ["audience must be non-empty string" for a in rule.audiences if not a]
    if not rule.issuer and not rule.jwks_uri:
        errors.append("issuer or jwksUri must be non-empty string")
    if rule.jwks_uri:
        errors.append(jwks_uri_error(rule.jwks_uri))
    if rule.jwks:
        errors.append(jwks_error(rule.jwks))
    for header in rule.from_headers:
        if not header.name:
            errors.append("location header name must be non-empty string")
    errors.extend("location query must be non-empty string" for p in rule.from_params if not p)
    errors.extend("cookie name must be non-empty string" for c in rule.from_cookies if not c)
    for output in rule.output_claim_to_headers:
        if not output.claim or not output.header:
            errors.append("outputClaimToHeaders header and claim value must be non-empty string")
            continue
        errors.append(matches.validate_strict_header_name(output.header))
    if rule.HasField("timeout"):
        errors.append(validate_duration(rule.timeout))
    return [e for e in errors if e is not None]


@register(Kind.REQUEST_AUTHENTICATION)
def validate_request_authentication(config: Config, report: Report) -> None:
    """A RequestAuthentication: its targets and JWT rules."""
    ra = config.spec
    check_policy_targets(ra, report)
    for rule in ra.jwt_rules:
        report.errors.extend(_jwt_rule_errors(rule))
