"""The security filters of a sidecar's inbound chains, from the policies that select it.

istiod's order in an inbound HTTP connection manager: metadata exchange, CUSTOM authorization (RBAC
and ``ext_authz``), ``jwt_authn``, then RBAC (AUDIT, DENY, ALLOW), then the rest. Inbound TCP chains
get the CUSTOM and RBAC network filters before ``tcp_proxy``. ``inputs`` is computed first; the cache
key of the inbound listeners includes its ``key`` (policy specs, annotations, the fetched JWKS the
filter inlines, and the resolved ext_authz providers when CUSTOM policies apply).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from meshpilot.model.authorization import (
    AuthorizationPolicies,
    authorization_policies,
    request_authentications,
)
from meshpilot.model.config import Config
from meshpilot.model.jwks import JwksLookup
from meshpilot.model.proxy import NodeType, Proxy
from meshpilot.model.push_context import PushContext
from meshpilot.networking import authz_custom, ext_authz, jwt_authn, rbac
from meshpilot.networking.authz_rule import TrustDomains


@dataclass(frozen=True, slots=True)
class SecurityInputs:
    """What the inbound security filters of a proxy are built from."""

    policies: AuthorizationPolicies
    request_authentications: tuple[Config, ...]
    trust: TrustDomains
    lookup: JwksLookup
    #: Fetched JWKS the filter will inline, in provider order.
    jwks: tuple[str, ...]
    #: istiod's ``clear_route_cache`` on JWT providers: set for every proxy but a sidecar (a gateway
    #: routes on headers the JWT filter may add, so its route is picked again after the filter).
    clear_route_cache: bool = False
    #: The MeshConfig's ext_authz providers, resolved against the services; only read (and only
    #: resolved) when a CUSTOM policy applies, so other proxies' keys do not follow them.
    providers: ext_authz.ExtAuthzProviders = ext_authz.NO_PROVIDERS

    @property
    def key(self) -> Hashable:
        ras = tuple((c.key, c.spec_hash) for c in self.request_authentications)
        return (
            self.policies.fingerprint(),
            ras,
            self.trust,
            self.jwks,
            self.clear_route_cache,
            self.providers.key,
        )

    @property
    def empty(self) -> bool:
        return self.policies.empty and not self.request_authentications


def inputs(proxy: Proxy, push: PushContext) -> SecurityInputs:
    ras = request_authentications(push, proxy)
    policies = authorization_policies(push, proxy)
    clear = proxy.type is not NodeType.SIDECAR
    if not ras and policies.empty:
        # Most workloads of a mesh: no policy selects them, and they share one answer per snapshot
        # (asked per proxy on every full push, for the inbound listeners' key).
        found: SecurityInputs = push.memoized(
            ("security-inputs-none", clear), lambda: _inputs(push, policies, ras, clear)
        )
        return found
    return _inputs(push, policies, ras, clear)


def _inputs(
    push: PushContext, policies: AuthorizationPolicies, ras: tuple[Config, ...], clear: bool
) -> SecurityInputs:
    lookup = push.jwks
    return SecurityInputs(
        policies=policies,
        request_authentications=ras,
        trust=rbac.trust_domains(push.mesh),
        lookup=lookup,
        jwks=jwt_authn.jwks_fingerprint(ras, lookup) if ras else (),
        clear_route_cache=clear,
        providers=ext_authz.providers(push) if policies.custom else ext_authz.NO_PROVIDERS,
    )


@dataclass(frozen=True, slots=True)
class InboundSecurityFilters:
    http: tuple[Any, ...]
    tcp: tuple[Any, ...]


NO_FILTERS = InboundSecurityFilters((), ())


def build(security: SecurityInputs) -> InboundSecurityFilters:
    """The HTTP filters (CUSTOM, JWT, RBAC) and the network filters (CUSTOM, RBAC) of inbound chains."""
    if security.empty:
        return NO_FILTERS
    custom = security.policies.custom
    http: list[Any] = authz_custom.http_filters(custom, security.providers, security.trust) if custom else []
    jwt = jwt_authn.jwt_filter(
        security.request_authentications, security.lookup, clear_route_cache=security.clear_route_cache
    )
    if jwt is not None:
        http.append(jwt)
    http += rbac.http_filters(security.policies, security.trust)
    tcp: list[Any] = authz_custom.tcp_filters(custom, security.providers, security.trust) if custom else []
    tcp += rbac.tcp_filters(security.policies, security.trust)
    return InboundSecurityFilters(tuple(http), tuple(tcp))


def filters(proxy: Proxy, push: PushContext) -> InboundSecurityFilters:
    """The security filters of ``proxy``'s inbound chains (or a gateway's listeners), built once per
    snapshot for all proxies with the same policies."""
    security = inputs(proxy, push)
    return push.memoized(("inbound-security", security.key), lambda: build(security))
