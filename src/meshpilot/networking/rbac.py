"""AuthorizationPolicy as Envoy RBAC filters, as istiod builds them (``security/authz/builder``).

One rule of a policy becomes one RBAC policy named ``ns[<ns>]-policy[<name>]-rule[<i>]`` (built by
``authz_rule``, from the matchers of ``authz_matchers``). Its ``from`` entries become principals (one
per entry, or one matching anything), its ``to`` entries permissions; ``when`` conditions join
whichever side their key belongs to.

A field that cannot apply (an HTTP-only field on a TCP chain, a bad value) is handled as istiod
does: in an ALLOW policy the whole rule is dropped (it can then allow less), in a DENY or AUDIT
policy only that field is dropped (it then denies more). An ALLOW or DENY policy without rules
gets a policy that never matches, so an ALLOW one denies everything.

Filters come in istiod's order: CUSTOM (before JWT, built by ``authz_custom``), then AUDIT, DENY,
ALLOW.
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
from meshpilot.networking.ext_authz import POLICY_PREFIX
from meshpilot.networking.policy_problems import PROBLEMS
from meshpilot.networking.protobuf import pack

HTTP_RBAC = "envoy.filters.http.rbac"
TCP_RBAC = "envoy.filters.network.rbac"
TCP_STAT_PREFIX = "tcp."
DRY_RUN_ANNOTATION = "istio.io/dry-run"
_SHADOW_PREFIX = {rbac_pb2.RBAC.ALLOW: "istio_dry_run_allow_", rbac_pb2.RBAC.DENY: "istio_dry_run_deny_"}
BAD_CUSTOM_SUFFIX = "-deny-due-to-bad-CUSTOM-action"
_KIND = "AuthorizationPolicy"


def policy_name(namespace: str, name: str, rule: int, provider: str | None = None) -> str:
    prefix = ""
    if provider is not None:
        prefix = f"{POLICY_PREFIX}-{provider}-" if provider else f"{POLICY_PREFIX}-"
    return f"{prefix}ns[{namespace}]-policy[{name}]-rule[{rule}]"


def dry_run(config: Config) -> bool:
    value = config.meta.annotations.get(DRY_RUN_ANNOTATION)
    if value is None:
        return False
    parsed = {"1": True, "t": True, "true": True, "0": False, "f": False, "false": False}.get(value.lower())
    if parsed is None:
        report(config, f"failed to parse the value of {DRY_RUN_ANNOTATION}: {value!r}")
        return False
    return parsed


def report(config: Config, message: str) -> None:
    """Log and count a problem of one AuthorizationPolicy."""
    PROBLEMS.record(_KIND, f"{config.namespace}/{config.name}", message)


@dataclass(slots=True)
class BuiltRules:
    """The RBAC rules of a group of policies: enforced, and dry-run (``istio.io/dry-run``); each
    None when no policy of the group is of that kind."""

    rules: Any | None
    shadow: Any | None


def build_rules(
    configs: Sequence[Config], action: int, trust: TrustDomains, *, for_tcp: bool, custom: bool = False
) -> BuiltRules | None:
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
                    report(config, f"skipped rule {name}: {err}")
                continue
            target.policies[name].CopyFrom(generated)
        if not spec.rules:
            never = policy_name(config.namespace, config.name, 0, provider)
            target.policies[never].CopyFrom(never_matching())
    return BuiltRules(enforce if has_enforce else None, shadow if has_shadow else None)


def http_filter(config: Any) -> Any:
    return hcm_pb2.HttpFilter(name=HTTP_RBAC, typed_config=pack(config))


def tcp_filter(config: Any) -> Any:
    return listener_components_pb2.Filter(name=TCP_RBAC, typed_config=pack(config))


def _shadow_prefix(built: BuiltRules) -> str:
    """istiod reads the action of absent shadow rules as ALLOW's (the proto default), so its
    filters always carry a shadow stat prefix."""
    action = built.shadow.action if built.shadow is not None else rbac_pb2.RBAC.ALLOW
    return _SHADOW_PREFIX.get(action, "")


def _http_rbac(built: BuiltRules) -> Any:
    config = http_rbac_pb2.RBAC()
    if built.rules is not None:
        config.rules.CopyFrom(built.rules)
    if built.shadow is not None:
        config.shadow_rules.CopyFrom(built.shadow)
    config.shadow_rules_stat_prefix = _shadow_prefix(built)
    return config


def _tcp_rbac(built: BuiltRules) -> Any:
    config = tcp_rbac_pb2.RBAC(stat_prefix=TCP_STAT_PREFIX)
    if built.rules is not None:
        config.rules.CopyFrom(built.rules)
    if built.shadow is not None:
        config.shadow_rules.CopyFrom(built.shadow)
    config.shadow_rules_stat_prefix = _shadow_prefix(built)
    return config


def _local(policies: AuthorizationPolicies, trust: TrustDomains, *, for_tcp: bool) -> list[Any]:
    out = []
    for configs, action in (
        (policies.audit, rbac_pb2.RBAC.LOG),
        (policies.deny, rbac_pb2.RBAC.DENY),
        (policies.allow, rbac_pb2.RBAC.ALLOW),
    ):
        built = build_rules(configs, action, trust, for_tcp=for_tcp)
        if built is not None:
            out.append(tcp_filter(_tcp_rbac(built)) if for_tcp else http_filter(_http_rbac(built)))
    return out


def http_filters(policies: AuthorizationPolicies, trust: TrustDomains) -> list[Any]:
    """The HTTP RBAC filters of AUDIT, DENY and ALLOW policies, in that order."""
    return _local(policies, trust, for_tcp=False)


def tcp_filters(policies: AuthorizationPolicies, trust: TrustDomains) -> list[Any]:
    """The network RBAC filters of AUDIT, DENY and ALLOW policies, in that order (CUSTOM's go first)."""
    return _local(policies, trust, for_tcp=True)


def trust_domains(mesh: Any) -> TrustDomains:
    return TrustDomains((mesh.trust_domain, *mesh.trust_domain_aliases))
