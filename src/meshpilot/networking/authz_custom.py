"""CUSTOM AuthorizationPolicies as istiod builds them (``security/authz/builder``, CUSTOM action):
an RBAC filter that only marks requests, then the provider's ``ext_authz`` filter that checks the
marked ones.

The rules of a provider's CUSTOM policies (generated as DENY rules, named
``istio-ext-authz-<provider>-ns[<ns>]-policy[<name>]-rule[<i>]``) go into the RBAC filter's
*shadow* rules with the stat prefix ``istio_ext_authz_``: Envoy enforces nothing for them, but writes
the name of the policy a request matched into the filter's dynamic metadata. The ext_authz filter
after it is enabled by that metadata (``filter_enabled_metadata``), so it asks the provider about
exactly the requests some CUSTOM rule covers; everything else never reaches the provider. Dry-run
policies go into the RBAC filter's enforced rules, as istiod puts them (their matches are denied).

istiod's fail-closed paths, which meshpilot also logs and counts per policy:

- a provider that is not an ext_authz provider of the MeshConfig, or one with errors (a bad field,
  its service not found): the policies' rules become a DENY filter whose policies carry the
  ``-deny-due-to-bad-CUSTOM-action`` suffix, so what the provider would check is denied;
- more than one provider on one workload (istiod allows it only behind
  ``PILOT_ENABLE_MULTIPLE_CUSTOM_AUTHZ_PROVIDERS``, off by default): every provider gets that DENY
  filter.

On TCP chains only gRPC providers have a filter (``envoy.filters.network.ext_authz``); istiod leaves
an HTTP provider's policies off TCP chains, and so does meshpilot.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from envoy.config.listener.v3 import listener_components_pb2
from envoy.config.rbac.v3 import rbac_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2 as http_rbac_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.filters.network.rbac.v3 import rbac_pb2 as tcp_rbac_pb2

from meshpilot.model.config import Config
from meshpilot.networking import rbac
from meshpilot.networking.authz_rule import TrustDomains
from meshpilot.networking.ext_authz import (
    HTTP_EXT_AUTHZ,
    SHADOW_STAT_PREFIX,
    TCP_EXT_AUTHZ,
    ExtAuthzProvider,
    ExtAuthzProviders,
    with_enabled,
)
from meshpilot.networking.protobuf import pack


def _by_provider(configs: Sequence[Config]) -> dict[str, list[Config]]:
    groups: dict[str, list[Config]] = {}
    for config in configs:
        groups.setdefault(config.spec.provider.name, []).append(config)
    return dict(sorted(groups.items()))


def _bad_custom_rules(enforced: Any | None) -> Any:
    """istiod's deny rules for CUSTOM policies it cannot send to a provider: the enforced rules,
    renamed with the bad-CUSTOM suffix (dry-run policies deny nothing)."""
    rules = rbac_pb2.RBAC(action=rbac_pb2.RBAC.DENY)
    if enforced is not None:
        for name in sorted(enforced.policies):
            rules.policies[name + rbac.BAD_CUSTOM_SUFFIX].CopyFrom(enforced.policies[name])
    return rules


def _marking_rules(built: rbac.BuiltRules) -> tuple[Any, Any | None]:
    """The RBAC filter's shadow rules (the enforced policies, present even when empty) and its
    rules (the dry-run policies, only when there are some)."""
    shadow = built.rules if built.rules is not None else rbac_pb2.RBAC(action=rbac_pb2.RBAC.DENY)
    rules = built.shadow if built.shadow is not None and built.shadow.policies else None
    return shadow, rules


def _resolve(
    groups: dict[str, list[Config]], providers: ExtAuthzProviders
) -> dict[str, ExtAuthzProvider | None]:
    """Each provider of the workload's CUSTOM policies, or None where its policies must be denied
    (each such policy is reported once per reason)."""
    out: dict[str, ExtAuthzProvider | None] = {}
    for name, configs in groups.items():
        found = providers.find(name) if len(groups) == 1 else None
        if isinstance(found, ExtAuthzProvider):
            out[name] = found
            continue
        reason = (
            found
            if found is not None
            else f"{len(groups)} CUSTOM providers on one workload ({', '.join(groups)}); istiod allows "
            "one unless PILOT_ENABLE_MULTIPLE_CUSTOM_AUTHZ_PROVIDERS is set"
        )
        for config in configs:
            rbac.report(
                config,
                f"CUSTOM action with provider {name!r} cannot be used ({reason}); "
                "requests this policy matches are denied",
            )
        out[name] = None
    return out


def http_filters(configs: Sequence[Config], providers: ExtAuthzProviders, trust: TrustDomains) -> list[Any]:
    """The HTTP filters of CUSTOM policies, one RBAC and one ext_authz filter per provider (or one
    deny filter), in provider name order; they go before the JWT filter."""
    groups = _by_provider(configs)
    out: list[Any] = []
    for name, provider in _resolve(groups, providers).items():
        built = rbac.build_rules(groups[name], rbac_pb2.RBAC.DENY, trust, for_tcp=False, custom=True)
        assert built is not None
        if provider is None or provider.http is None:
            out.append(rbac.http_filter(http_rbac_pb2.RBAC(rules=_bad_custom_rules(built.rules))))
            continue
        shadow, rules = _marking_rules(built)
        marking = http_rbac_pb2.RBAC(shadow_rules=shadow, shadow_rules_stat_prefix=SHADOW_STAT_PREFIX)
        if rules is not None:
            marking.rules.CopyFrom(rules)
        check = with_enabled(provider.http, rbac.HTTP_RBAC, name)
        out += [
            rbac.http_filter(marking),
            hcm_pb2.HttpFilter(name=HTTP_EXT_AUTHZ, typed_config=pack(check)),
        ]
    return out


def tcp_filters(configs: Sequence[Config], providers: ExtAuthzProviders, trust: TrustDomains) -> list[Any]:
    """The network filters of CUSTOM policies for a TCP chain, before its RBAC filters."""
    groups = _by_provider(configs)
    out: list[Any] = []
    for name, provider in _resolve(groups, providers).items():
        built = rbac.build_rules(groups[name], rbac_pb2.RBAC.DENY, trust, for_tcp=True, custom=True)
        assert built is not None
        if provider is None:
            denying = _bad_custom_rules(built.rules)
            out.append(rbac.tcp_filter(tcp_rbac_pb2.RBAC(rules=denying, stat_prefix=rbac.TCP_STAT_PREFIX)))
            continue
        if provider.tcp is None:
            # An HTTP provider cannot check a TCP connection; istiod leaves the chain without it.
            continue
        shadow, rules = _marking_rules(built)
        marking = tcp_rbac_pb2.RBAC(
            shadow_rules=shadow,
            stat_prefix=rbac.TCP_STAT_PREFIX,
            shadow_rules_stat_prefix=SHADOW_STAT_PREFIX,
        )
        if rules is not None:
            marking.rules.CopyFrom(rules)
        check = with_enabled(provider.tcp, rbac.TCP_RBAC, name)
        out += [
            rbac.tcp_filter(marking),
            listener_components_pb2.Filter(name=TCP_EXT_AUTHZ, typed_config=pack(check)),
        ]
    return out
