"""One AuthorizationPolicy rule through istiod's authz model (``security/authz/model``): its ``from``,
``to`` and ``when`` as conditions, trust-domain aliases applied, then an Envoy RBAC policy.

Within an entry the fields are ANDed in istiod's order (principals: principal, request principal,
service account, trust domain, namespace, remote IP, source IP, then the ``when`` keys; permissions:
host, method, path, port, then the ``when`` keys); the values of one field are ORed, ``not*`` values
are a NOT of their OR.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from envoy.config.core.v3 import extension_pb2
from envoy.config.rbac.v3 import rbac_pb2
from envoy.extensions.path.match.uri_template.v3 import uri_template_match_pb2
from envoy.type.matcher.v3 import path_pb2, string_pb2, value_pb2

from meshpilot.networking.authz_matchers import (
    SPIFFE,
    Skip,
    cidr_range,
    header_matcher,
    jwt_claim_matcher,
    jwt_claim_string,
    metadata_matcher,
    name_in_brackets,
    names_in_brackets,
    quote_meta,
    regex_matcher,
    string_matcher,
    value_or,
)
from meshpilot.networking.protobuf import pack

# -- principals and permissions ---------------------------------------------------------------


def _authenticated(matcher: Any) -> Any:
    return rbac_pb2.Principal(authenticated=rbac_pb2.Principal.Authenticated(principal_name=matcher))


def _http_only(key: str, for_tcp: bool) -> None:
    if for_tcp:
        raise Skip(f'"{key}" is HTTP only')


def _p_source_ip(key: str, value: str, for_tcp: bool) -> Any:
    return rbac_pb2.Principal(direct_remote_ip=cidr_range(value))


def _p_remote_ip(key: str, value: str, for_tcp: bool) -> Any:
    return rbac_pb2.Principal(remote_ip=cidr_range(value))


def _p_namespace(key: str, value: str, for_tcp: bool) -> Any:
    pattern = ".*".join(quote_meta(part) for part in value.split("*"))
    return _authenticated(regex_matcher(f".*/ns/{pattern}/.*"))


def _p_trust_domain(key: str, value: str, for_tcp: bool) -> Any:
    if value == "*":
        return _authenticated(string_pb2.StringMatcher(prefix=SPIFFE))
    if "*" not in value:
        return _authenticated(string_pb2.StringMatcher(prefix=f"{SPIFFE}{value}/"))
    head, tail = value.split("*", 1)
    return _authenticated(regex_matcher(f"spiffe://{quote_meta(head)}[^/]*{quote_meta(tail)}/.*"))


def _p_principal(key: str, value: str, for_tcp: bool) -> Any:
    return _authenticated(string_matcher(value, SPIFFE))


def _p_header(key: str, value: str, for_tcp: bool) -> Any:
    _http_only(key, for_tcp)
    return rbac_pb2.Principal(header=header_matcher(name_in_brackets(key[len("request.headers") :]), value))


def _service_account_principal(policy_namespace: str) -> Callable[[str, str, bool], Any]:
    def make(key: str, value: str, for_tcp: bool) -> Any:
        namespace, sep, account = value.partition("/")
        if not sep:
            namespace, account = policy_namespace, value
        regex = f"spiffe://.+/ns/{quote_meta(namespace)}/(.+/|)sa/{quote_meta(account)}(/.+)?"
        return _authenticated(regex_matcher(regex))

    return make


def _x_request_principals(key: str, values: Sequence[str], for_tcp: bool) -> Any:
    _http_only(key, for_tcp)
    any_value = regex_matcher(".+")
    ors = []
    for value in values:
        idx = value.rfind("/")
        found = idx >= 0
        iss, sub = (value[:idx], value[idx + 1 :]) if found else (value, "")
        if value == "*":
            match_iss, match_sub = any_value, any_value
        elif value.startswith("*"):
            if found:
                match_iss = any_value if iss == "*" else string_pb2.StringMatcher(suffix=iss[1:])
                match_sub = string_pb2.StringMatcher(exact=sub)
            else:
                match_iss, match_sub = any_value, string_pb2.StringMatcher(suffix=value[1:])
        elif value.endswith("*"):
            if found:
                match_iss = string_pb2.StringMatcher(exact=iss)
                match_sub = any_value if sub == "*" else string_pb2.StringMatcher(prefix=sub[:-1])
            else:
                match_iss, match_sub = string_pb2.StringMatcher(prefix=value[:-1]), any_value
        else:
            match_iss, match_sub = string_pb2.StringMatcher(exact=iss), string_pb2.StringMatcher(exact=sub)
        ors.append(
            _p_and(
                [
                    rbac_pb2.Principal(metadata=jwt_claim_string("iss", match_iss)),
                    rbac_pb2.Principal(metadata=jwt_claim_string("sub", match_sub)),
                ]
            )
        )
    if not ors:
        return None
    return ors[0] if len(ors) == 1 else _p_or(ors)


def _x_claim(claim: str) -> Callable[[str, Sequence[str], bool], Any]:
    def make(key: str, values: Sequence[str], for_tcp: bool) -> Any:
        _http_only(key, for_tcp)
        return rbac_pb2.Principal(metadata=jwt_claim_matcher([claim], value_or(values)))

    return make


def _x_claims(key: str, values: Sequence[str], for_tcp: bool) -> Any:
    _http_only(key, for_tcp)
    claims = names_in_brackets(key[len("request.auth.claims") :])
    return rbac_pb2.Principal(metadata=jwt_claim_matcher(claims, value_or(values)))


def _q_dest_ip(key: str, value: str, for_tcp: bool) -> Any:
    return rbac_pb2.Permission(destination_ip=cidr_range(value))


def _q_dest_port(key: str, value: str, for_tcp: bool) -> Any:
    if not value.isdigit() or int(value) > 65535:
        raise Skip(f"invalid port {value}")
    return rbac_pb2.Permission(destination_port=int(value))


def _q_sni(key: str, value: str, for_tcp: bool) -> Any:
    return rbac_pb2.Permission(requested_server_name=string_matcher(value))


def _q_host(key: str, value: str, for_tcp: bool) -> Any:
    _http_only(key, for_tcp)
    return rbac_pb2.Permission(header=header_matcher(":authority", value, ignore_case=True))


def _q_method(key: str, value: str, for_tcp: bool) -> Any:
    _http_only(key, for_tcp)
    return rbac_pb2.Permission(header=header_matcher(":method", value))


def _q_path(key: str, value: str, for_tcp: bool) -> Any:
    _http_only(key, for_tcp)
    if "{*}" in value or "{**}" in value:
        template = value.replace("{**}", "**").replace("{*}", "*")
        config = uri_template_match_pb2.UriTemplateMatchConfig(path_template=template)
        return rbac_pb2.Permission(
            uri_template=extension_pb2.TypedExtensionConfig(name="uri-template", typed_config=pack(config))
        )
    return rbac_pb2.Permission(url_path=path_pb2.PathMatcher(path=string_matcher(value)))


def _q_envoy_filter(key: str, values: Sequence[str], for_tcp: bool) -> Any:
    parts = key[len("experimental.") :].removesuffix("]").split("[", 1)
    if len(parts) != 2:
        raise Skip(f"invalid key: {key}")
    matchers = []
    for value in values:
        if value.startswith("[") and value.endswith("]"):
            inner = value_pb2.ValueMatcher(string_match=string_matcher(value.strip("[]")))
            matchers.append(value_pb2.ValueMatcher(list_match=value_pb2.ListMatcher(one_of=inner)))
        else:
            matchers.append(value_pb2.ValueMatcher(string_match=string_matcher(value)))
    value_matcher = (
        matchers[0]
        if len(matchers) == 1
        else value_pb2.ValueMatcher(or_match=value_pb2.OrMatcher(value_matchers=matchers))
    )
    return rbac_pb2.Permission(metadata=metadata_matcher(parts[0], [parts[1]], value_matcher))


def _p_and(ids: list[Any]) -> Any:
    return rbac_pb2.Principal(and_ids=rbac_pb2.Principal.Set(ids=ids))


def _p_or(ids: list[Any]) -> Any:
    return rbac_pb2.Principal(or_ids=rbac_pb2.Principal.Set(ids=ids))


def _q_and(rules: list[Any]) -> Any:
    return rbac_pb2.Permission(and_rules=rbac_pb2.Permission.Set(rules=rules))


def _q_or(rules: list[Any]) -> Any:
    return rbac_pb2.Permission(or_rules=rbac_pb2.Permission.Set(rules=rules))


# -- the model of one rule (istiod's authz/model) -----------------------------------------------


@dataclass(frozen=True, slots=True)
class _Condition:
    key: str
    values: tuple[str, ...]
    not_values: tuple[str, ...]
    #: One matcher per value, ORed (``single``), or one matcher for all values (``extended``).
    single: Callable[[str, str, bool], Any] | None = None
    extended: Callable[[str, Sequence[str], bool], Any] | None = None


_PRINCIPAL_KEYS: dict[str, Callable[[str, str, bool], Any]] = {
    "source.ip": _p_source_ip,
    "remote.ip": _p_remote_ip,
    "source.namespace": _p_namespace,
    "source.trustDomain": _p_trust_domain,
    "source.principal": _p_principal,
}
_EXTENDED_PRINCIPAL_KEYS: dict[str, Callable[[str, Sequence[str], bool], Any]] = {
    "request.auth.principal": _x_request_principals,
    "request.auth.audiences": _x_claim("aud"),
    "request.auth.presenter": _x_claim("azp"),
}
_PERMISSION_KEYS: dict[str, Callable[[str, str, bool], Any]] = {
    "destination.ip": _q_dest_ip,
    "destination.port": _q_dest_port,
    "connection.sni": _q_sni,
}


def _condition(key: str, values: Sequence[str], not_values: Sequence[str], **make: Any) -> list[_Condition]:
    if not values and not not_values:
        return []
    return [_Condition(key, tuple(values), tuple(not_values), **make)]


def _when(rule: Any, policy_namespace: str) -> tuple[list[_Condition], list[_Condition]]:
    """The ``when`` conditions as (principal side, permission side); unknown keys raise Skip."""
    principals: list[_Condition] = []
    permissions: list[_Condition] = []
    for when in rule.when:
        key, values, nots = when.key, list(when.values), list(when.not_values)
        if key in _PERMISSION_KEYS:
            permissions += _condition(key, values, nots, single=_PERMISSION_KEYS[key])
        elif key.startswith("experimental.envoy.filters."):
            permissions += _condition(key, values, nots, extended=_q_envoy_filter)
        elif key in _PRINCIPAL_KEYS:
            principals += _condition(key, values, nots, single=_PRINCIPAL_KEYS[key])
        elif key == "source.serviceAccount":
            principals += _condition(key, values, nots, single=_service_account_principal(policy_namespace))
        elif key in _EXTENDED_PRINCIPAL_KEYS:
            principals += _condition(key, values, nots, extended=_EXTENDED_PRINCIPAL_KEYS[key])
        elif key.startswith("request.headers"):
            principals += _condition(key, values, nots, single=_p_header)
        elif key.startswith("request.auth.claims"):
            principals += _condition(key, values, nots, extended=_x_claims)
        else:
            raise Skip(f"unknown attribute {key}")
    return principals, permissions


def _source_conditions(source: Any, policy_namespace: str) -> list[_Condition]:
    """A ``from.source`` in istiod's order (each field is inserted at the front, last first)."""
    s = source
    return [
        *_condition("source.principal", s.principals, s.not_principals, single=_p_principal),
        *_condition(
            "request.auth.principal",
            s.request_principals,
            s.not_request_principals,
            extended=_x_request_principals,
        ),
        *_condition(
            "source.serviceAccount",
            s.service_accounts,
            s.not_service_accounts,
            single=_service_account_principal(policy_namespace),
        ),
        *_condition("source.trustDomain", s.trust_domains, s.not_trust_domains, single=_p_trust_domain),
        *_condition("source.namespace", s.namespaces, s.not_namespaces, single=_p_namespace),
        *_condition("remote.ip", s.remote_ip_blocks, s.not_remote_ip_blocks, single=_p_remote_ip),
        *_condition("source.ip", s.ip_blocks, s.not_ip_blocks, single=_p_source_ip),
    ]


def _operation_conditions(op: Any) -> list[_Condition]:
    return [
        *_condition(":authority", op.hosts, op.not_hosts, single=_q_host),
        *_condition(":method", op.methods, op.not_methods, single=_q_method),
        *_condition("path-matcher", op.paths, op.not_paths, single=_q_path),
        *_condition("destination.port", op.ports, op.not_ports, single=_q_dest_port),
    ]


@dataclass(frozen=True, slots=True)
class TrustDomains:
    """The mesh's trust domain and its aliases (istiod's trustdomain.Bundle)."""

    domains: tuple[str, ...]

    def replace_aliases(self, principals: Sequence[str]) -> tuple[str, ...]:
        """Each ``<td>/ns/<ns>/sa/<sa>`` principal of a known trust domain, once per domain."""
        out: list[str] = []
        for principal in principals:
            parts = principal.split("/")
            if len(parts) != 5 or parts[0] == "*":
                out.append(principal)
                continue
            domain = parts[0]
            if not (_matches_any(domain, self.domains) or domain == "cluster.local"):
                out.append(principal)
                continue
            expanded: list[str] = []
            for td in self.domains:
                replaced = principal if _suffix(td, domain) else "/".join([td, *parts[1:]])
                if replaced not in expanded:
                    expanded.append(replaced)
            out.extend(expanded)
        return tuple(out)

    def expand_aliases(self, values: Sequence[str]) -> tuple[str, ...]:
        out: list[str] = []
        for value in values:
            for v in self.domains if value in self.domains else (value,):
                if v not in out:
                    out.append(v)
        return tuple(out)


def _prefix(a: str, pattern: str) -> bool:
    return pattern.endswith("*") and a.startswith(pattern[:-1])


def _suffix(a: str, pattern: str) -> bool:
    return pattern.startswith("*") and a.endswith(pattern[1:])


def _matches_any(a: str, domains: Sequence[str]) -> bool:
    return any(
        a == s or s == "*" or _prefix(a, s) or _prefix(s, a) or _suffix(a, s) or _suffix(s, a)
        for s in domains
    )


def _migrate(conditions: list[_Condition], trust: TrustDomains | None) -> list[_Condition]:
    if trust is None:
        return conditions
    if len(trust.domains) <= 1 and all(c.key != "source.principal" for c in conditions):
        return conditions
    out = []
    for c in conditions:
        if c.key == "source.principal":
            c = _Condition(
                c.key, trust.replace_aliases(c.values), trust.replace_aliases(c.not_values), c.single
            )
        elif c.key == "source.trustDomain":
            c = _Condition(
                c.key, trust.expand_aliases(c.values), trust.expand_aliases(c.not_values), c.single
            )
        out.append(c)
    return out


def _matchers(c: _Condition, for_tcp: bool, strict: bool, *, principal: bool) -> list[Any]:
    """The ANDed matchers of one condition. A value that cannot apply raises in ``strict`` mode
    (ALLOW: the rule is skipped) and is left out otherwise (DENY, AUDIT: the match widens)."""
    orer, notter = (_p_or, _p_not) if principal else (_q_or, _q_not)
    out: list[Any] = []
    for values, negate in ((c.values, False), (c.not_values, True)):
        if not values:
            continue
        found: list[Any] = []
        try:
            if c.extended is not None:
                matcher = c.extended(c.key, values, for_tcp)
                if matcher is not None:
                    out.append(notter(matcher) if negate else matcher)
                continue
        except Skip:
            if strict:
                raise
            continue
        assert c.single is not None
        for value in values:
            try:
                found.append(c.single(c.key, value, for_tcp))
            except Skip:
                if strict:
                    raise
        if found:
            out.append(notter(orer(found)) if negate else orer(found))
    return out


def _p_not(principal: Any) -> Any:
    return rbac_pb2.Principal(not_id=principal)


def _q_not(permission: Any) -> Any:
    return rbac_pb2.Permission(not_rule=permission)


def rule_policy(
    rule: Any, policy_namespace: str, trust: TrustDomains | None, *, for_tcp: bool, action: int
) -> Any:
    """The RBAC policy of one rule; raises Skip when istiod would skip the rule. ``trust`` None
    leaves principals' trust domains as written (istiod's grpcgen does not migrate them)."""
    when_principals, when_permissions = _when(rule, policy_namespace)
    principal_lists = [
        _source_conditions(f.source, policy_namespace) + when_principals for f in getattr(rule, "from")
    ] or [list(when_principals)]
    permission_lists = [_operation_conditions(t.operation) + when_permissions for t in rule.to] or [
        list(when_permissions)
    ]
    strict = action == rbac_pb2.RBAC.ALLOW
    policy = rbac_pb2.Policy()
    for conditions in permission_lists:
        ands = [m for c in conditions for m in _matchers(c, for_tcp, strict, principal=False)]
        policy.permissions.append(_q_and(ands or [rbac_pb2.Permission(any=True)]))
    for conditions in principal_lists:
        ands = [m for c in _migrate(conditions, trust) for m in _matchers(c, for_tcp, strict, principal=True)]
        policy.principals.append(_p_and(ands or [rbac_pb2.Principal(any=True)]))
    return policy


@dataclass(frozen=True, slots=True)
class RuleResult:
    """One rule through istiod's authz model: its policy, or why there is none."""

    policy: Any | None
    error: str = ""
    #: False when the model could not be built at all (an unknown ``when`` key: istiod's New
    #: fails); True when it was built but could not be generated (istiod's Generate fails).
    parsed: bool = True


def try_rule_policy(
    rule: Any, policy_namespace: str, trust: TrustDomains | None, *, for_tcp: bool, action: int
) -> RuleResult:
    """``rule_policy`` without raising, telling a rule istiod cannot model from one it cannot generate."""
    try:
        _when(rule, policy_namespace)
    except Skip as err:
        return RuleResult(None, str(err), parsed=False)
    try:
        return RuleResult(rule_policy(rule, policy_namespace, trust, for_tcp=for_tcp, action=action))
    except Skip as err:
        return RuleResult(None, str(err))


def never_matching() -> Any:
    return rbac_pb2.Policy(
        permissions=[rbac_pb2.Permission(not_rule=rbac_pb2.Permission(any=True))],
        principals=[rbac_pb2.Principal(not_id=rbac_pb2.Principal(any=True))],
    )
