"""AuthorizationPolicy as Envoy RBAC filters, as istiod builds them (``security/authz/builder``).

One rule of a policy becomes one RBAC policy named ``ns[<ns>]-policy[<name>]-rule[<i>]`` (built by
``authz_rule``, from the matchers of ``authz_matchers``). Its ``from`` entries become principals (one
per entry, or one matching anything), its ``to`` entries permissions; ``when`` conditions join
whichever side their key belongs to.

A field that cannot apply (an HTTP-only field on a TCP chain, a bad value) is handled as istiod
does: in an ALLOW policy the whole rule is dropped (it can then allow less), in a DENY or AUDIT
policy only that field is dropped (it then denies more). An ALLOW or DENY policy without rules
gets a policy that never matches, so an ALLOW one denies everything.

Filters come in istiod's order: CUSTOM (before JWT), then AUDIT, DENY, ALLOW. CUSTOM needs an
ext_authz provider from MeshConfig, which meshpilot does not build: such a policy gets the deny
filter istiod emits for an unusable provider (``-deny-due-to-bad-CUSTOM-action``), so it fails
closed, and the problem is logged and counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from envoy.config.listener.v3 import listener_components_pb2
from envoy.config.rbac.v3 import rbac_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2 as http_rbac_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.filters.network.rbac.v3 import rbac_pb2 as tcp_rbac_pb2

from meshpilot.model.authorization import AuthorizationPolicies
from meshpilot.model.config import Config
from meshpilot.networking.authz_matchers import (
    Skip,
)
from meshpilot.networking.authz_rule import (
    TrustDomains,
    never_matching,
    rule_policy,
)
from meshpilot.networking.policy_problems import PROBLEMS
from meshpilot.networking.protobuf import pack

HTTP_RBAC = "envoy.filters.http.rbac"
TCP_RBAC = "envoy.filters.network.rbac"
TCP_STAT_PREFIX = "tcp."
DRY_RUN_ANNOTATION = "istio.io/dry-run"
_SHADOW_PREFIX = {rbac_pb2.RBAC.ALLOW: "istio_dry_run_allow_", rbac_pb2.RBAC.DENY: "istio_dry_run_deny_"}
_EXT_AUTHZ_PREFIX = "istio-ext-authz"
BAD_CUSTOM_SUFFIX = "-deny-due-to-bad-CUSTOM-action"
_KIND = "AuthorizationPolicy"


def policy_name(namespace: str, name: str, rule: int, provider: str | None = None) -> str:
    prefix = ""
    if provider is not None:
        prefix = f"{_EXT_AUTHZ_PREFIX}-{provider}-" if provider else f"{_EXT_AUTHZ_PREFIX}-"
    return f"{prefix}ns[{namespace}]-policy[{name}]-rule[{rule}]"


def dry_run(config: Config) -> bool:
    value = config.meta.annotations.get(DRY_RUN_ANNOTATION)
    if value is None:
        return False
    parsed = {"1": True, "t": True, "true": True, "0": False, "f": False, "false": False}.get(value.lower())
    if parsed is None:
        _report(config, f"failed to parse the value of {DRY_RUN_ANNOTATION}: {value!r}")
        return False
    return parsed


def _report(config: Config, message: str) -> None:
    PROBLEMS.record(_KIND, f"{config.namespace}/{config.name}", message)


@dataclass(slots=True)
class _Built:
    rules: Any | None
    shadow: Any | None


def _build(
    configs: Sequence[Config], action: int, trust: TrustDomains, *, for_tcp: bool, custom: bool = False
) -> _Built | None:
    if not configs:
        return None
    enforce = rbac_pb2.RBAC(action=action)
    shadow = rbac_pb2.RBAC(action=action)
    has_enforce = has_shadow = False
    for config in configs:
        spec = config.spec
        provider = spec.provider.name if custom else None
        if dry_run(config):
            target, has_shadow = shadow, True
        else:
            target, has_enforce = enforce, True
        for i, rule in enumerate(spec.rules):
            name = policy_name(config.namespace, config.name, i, provider)
            try:
                generated = rule_policy(rule, config.namespace, trust, for_tcp=for_tcp, action=action)
            except Skip as err:
                # istiod logs this at debug level for TCP chains; an invalid rule is an error there.
                if not for_tcp:
                    _report(config, f"skipped rule {name}: {err}")
                continue
            target.policies[name].CopyFrom(generated)
        if not spec.rules:
            never = policy_name(config.namespace, config.name, 0, provider)
            target.policies[never].CopyFrom(never_matching())
    return _Built(enforce if has_enforce else None, shadow if has_shadow else None)


def _http_filter(config: Any) -> Any:
    return hcm_pb2.HttpFilter(name=HTTP_RBAC, typed_config=pack(config))


def _tcp_filter(config: Any) -> Any:
    return listener_components_pb2.Filter(name=TCP_RBAC, typed_config=pack(config))


def _shadow_prefix(built: _Built) -> str:
    """istiod reads the action of absent shadow rules as ALLOW's (the proto default), so its
    filters always carry a shadow stat prefix."""
    action = built.shadow.action if built.shadow is not None else rbac_pb2.RBAC.ALLOW
    return _SHADOW_PREFIX.get(action, "")


def _http_rbac(built: _Built) -> Any:
    config = http_rbac_pb2.RBAC()
    if built.rules is not None:
        config.rules.CopyFrom(built.rules)
    if built.shadow is not None:
        config.shadow_rules.CopyFrom(built.shadow)
    config.shadow_rules_stat_prefix = _shadow_prefix(built)
    return config


def _tcp_rbac(built: _Built) -> Any:
    config = tcp_rbac_pb2.RBAC(stat_prefix=TCP_STAT_PREFIX)
    if built.rules is not None:
        config.rules.CopyFrom(built.rules)
    if built.shadow is not None:
        config.shadow_rules.CopyFrom(built.shadow)
    config.shadow_rules_stat_prefix = _shadow_prefix(built)
    return config


def _bad_custom(configs: Sequence[Config], trust: TrustDomains, *, for_tcp: bool) -> list[Any]:
    """CUSTOM policies as istiod emits them when their provider cannot be used: DENY filters,
    one per provider, whose policies carry the ``-deny-due-to-bad-CUSTOM-action`` suffix."""
    by_provider: dict[str, list[Config]] = {}
    for config in configs:
        by_provider.setdefault(config.spec.provider.name, []).append(config)
    out = []
    for provider in sorted(by_provider):
        group = by_provider[provider]
        for config in group:
            _report(
                config,
                f"CUSTOM action with provider {provider!r}: meshpilot does not build ext_authz filters; "
                "requests this policy matches are denied",
            )
        built = _build(group, rbac_pb2.RBAC.DENY, trust, for_tcp=for_tcp, custom=True)
        assert built is not None
        rules = rbac_pb2.RBAC(action=rbac_pb2.RBAC.DENY)
        if built.rules is not None:
            for name in sorted(built.rules.policies):
                rules.policies[name + BAD_CUSTOM_SUFFIX].CopyFrom(built.rules.policies[name])
        if for_tcp:
            out.append(_tcp_filter(tcp_rbac_pb2.RBAC(rules=rules, stat_prefix=TCP_STAT_PREFIX)))
        else:
            out.append(_http_filter(http_rbac_pb2.RBAC(rules=rules)))
    return out


def _local(policies: AuthorizationPolicies, trust: TrustDomains, *, for_tcp: bool) -> list[Any]:
    out = []
    for configs, action in (
        (policies.audit, rbac_pb2.RBAC.LOG),
        (policies.deny, rbac_pb2.RBAC.DENY),
        (policies.allow, rbac_pb2.RBAC.ALLOW),
    ):
        built = _build(configs, action, trust, for_tcp=for_tcp)
        if built is not None:
            out.append(_tcp_filter(_tcp_rbac(built)) if for_tcp else _http_filter(_http_rbac(built)))
    return out


def http_custom_filters(policies: AuthorizationPolicies, trust: TrustDomains) -> list[Any]:
    """The HTTP filters of CUSTOM policies (they go before the JWT filter)."""
    return _bad_custom(policies.custom, trust, for_tcp=False) if policies.custom else []


def http_filters(policies: AuthorizationPolicies, trust: TrustDomains) -> list[Any]:
    """The HTTP RBAC filters of AUDIT, DENY and ALLOW policies, in that order."""
    return _local(policies, trust, for_tcp=False)


def tcp_filters(policies: AuthorizationPolicies, trust: TrustDomains) -> list[Any]:
    """The network RBAC filters of an inbound TCP chain: CUSTOM, AUDIT, DENY, ALLOW."""
    out = _bad_custom(policies.custom, trust, for_tcp=True) if policies.custom else []
    return out + _local(policies, trust, for_tcp=True)


def trust_domains(mesh: Any) -> TrustDomains:
    return TrustDomains((mesh.trust_domain, *mesh.trust_domain_aliases))
