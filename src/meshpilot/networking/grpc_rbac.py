"""AuthorizationPolicy on proxyless gRPC servers, as istiod's grpcgen builds it (``lds.go``, buildRBAC).

gRPC's RBAC filter knows two actions, ALLOW and DENY. Each inbound filter chain of a gRPC server gets,
before the router, an ``envoy.filters.http.rbac.DENY`` filter (action DENY) from the DENY policies
selecting the server and an ``envoy.filters.http.rbac`` filter (action ALLOW) from the ALLOW ones,
each only when it holds a policy. A rule becomes one RBAC policy named ``<ns>-<name>-<i>``, generated
by the sidecar's rule builder (``authz_rule.rule_policy``) for HTTP with authenticated principals, but
without trust-domain alias migration (grpcgen does not migrate).

Where istiod's grpcgen would fail open, meshpilot fails closed, and each case is logged and counted
in ``meshpilot_policy_problems_total``:

- CUSTOM (ext_authz) policies: istiod's grpcgen ignores them. meshpilot adds their rules to the DENY
  filter (``<ns>-<name>-<i>-deny-due-to-bad-CUSTOM-action``), as it does on sidecars for a CUSTOM
  policy it cannot send to a provider: what the policy would check is denied.
- An ALLOW policy without rules: istiod's grpcgen adds nothing, so alone it allows everything;
  meshpilot adds a policy that never matches (``<ns>-<name>-0``), so it allows nothing, as on sidecars.
- An ALLOW rule that cannot be generated (a bad value): istiod stores a nil policy under its name,
  which gRPC reads as matching nothing; meshpilot stores a policy that never matches.

Unchanged from istiod but reported: AUDIT policies are ignored (gRPC cannot log), ``istio.io/dry-run``
is not honoured (gRPC has no shadow rules: the policy is enforced), a rule whose ``when`` key is unknown
is skipped, and RequestAuthentication does nothing (gRPC has no ``jwt_authn``: tokens are not checked,
and ``request.auth.*`` conditions never match).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from envoy.config.rbac.v3 import rbac_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2 as http_rbac_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)

from meshpilot.model.authorization import (
    AuthorizationPolicies,
    authorization_policies,
    request_authentications,
)
from meshpilot.model.config import Config
from meshpilot.model.proxy import Proxy
from meshpilot.model.push_context import PushContext
from meshpilot.networking import rbac
from meshpilot.networking.authz_rule import never_matching, try_rule_policy
from meshpilot.networking.policy_problems import PROBLEMS
from meshpilot.networking.protobuf import pack

ALLOW_FILTER = "envoy.filters.http.rbac"
DENY_FILTER = "envoy.filters.http.rbac.DENY"
_AUTHZ = "AuthorizationPolicy"
_REQUEST_AUTHN = "RequestAuthentication"


@dataclass(frozen=True, slots=True)
class GrpcSecurityInputs:
    """What a gRPC server's RBAC filters are built from."""

    policies: AuthorizationPolicies
    request_authentications: tuple[Config, ...]


def inputs(proxy: Proxy, push: PushContext) -> GrpcSecurityInputs:
    """The policies selecting the server (istiod's ListAuthorizationPolicies for the proxy)."""
    return GrpcSecurityInputs(authorization_policies(push, proxy), request_authentications(push, proxy))


def policy_name(namespace: str, name: str, rule: int) -> str:
    """grpcgen's name for a rule's RBAC policy: ``<ns>-<name>-<i>``."""
    return f"{namespace}-{name}-{rule}"


def _report(kind: str, config: Config, message: str) -> None:
    PROBLEMS.record(kind, f"{config.namespace}/{config.name}", message)


def _add_rules(out: Any, configs: Sequence[Config], action: int, suffix: str = "") -> None:
    """The rules of ``configs`` as ``out``'s policies, generated as for ``action``."""
    for config in configs:
        if rbac.dry_run(config):
            _report(
                _AUTHZ,
                config,
                f"{rbac.DRY_RUN_ANNOTATION} is not supported on proxyless gRPC servers; "
                "the policy is enforced there",
            )
        rules = config.spec.rules
        for i, rule in enumerate(rules):
            name = policy_name(config.namespace, config.name, i) + suffix
            result = try_rule_policy(rule, config.namespace, None, for_tcp=False, action=action)
            if result.policy is not None:
                out.policies[name].CopyFrom(result.policy)
                continue
            if result.parsed:
                # Only ALLOW fails to generate: the rule then allows nothing.
                _report(_AUTHZ, config, f"rule {name} allows nothing on proxyless gRPC: {result.error}")
                out.policies[name].CopyFrom(never_matching())
            else:
                _report(_AUTHZ, config, f"skipped rule {name} on proxyless gRPC: {result.error}")
        if not rules and action == rbac_pb2.RBAC.ALLOW:
            out.policies[policy_name(config.namespace, config.name, 0)].CopyFrom(never_matching())


def _filter(name: str, rules: Any) -> Any:
    return hcm_pb2.HttpFilter(name=name, typed_config=pack(http_rbac_pb2.RBAC(rules=rules)))


def http_filters(security: GrpcSecurityInputs) -> list[Any]:
    """The RBAC filters of a gRPC server's inbound chain (DENY, then ALLOW), to go before the router."""
    policies = security.policies
    for config in security.request_authentications:
        _report(
            _REQUEST_AUTHN,
            config,
            "proxyless gRPC servers have no JWT filter: tokens are not validated there, "
            "and request.auth.* conditions never match",
        )
    for config in policies.audit:
        _report(_AUTHZ, config, "AUDIT is not supported on proxyless gRPC servers; ignored there")
    out = []
    deny = rbac_pb2.RBAC(action=rbac_pb2.RBAC.DENY)
    for config in policies.custom:
        _report(
            _AUTHZ,
            config,
            f"CUSTOM action with provider {config.spec.provider.name!r} is not supported on proxyless gRPC "
            "servers; requests this policy matches are denied there",
        )
    _add_rules(deny, policies.custom, rbac_pb2.RBAC.DENY, rbac.BAD_CUSTOM_SUFFIX)
    _add_rules(deny, policies.deny, rbac_pb2.RBAC.DENY)
    if deny.policies:
        out.append(_filter(DENY_FILTER, deny))
    allow = rbac_pb2.RBAC(action=rbac_pb2.RBAC.ALLOW)
    _add_rules(allow, policies.allow, rbac_pb2.RBAC.ALLOW)
    if allow.policies:
        out.append(_filter(ALLOW_FILTER, allow))
    return out
