"""Whether a push request concerns a proxy (istiod's ProxyNeedsPush), and what a VirtualService's
push leaves of a sidecar's clusters and listeners (``imports_kept``, ``l4_routes_kept``).

A push asks this of every proxy with the same request, so what depends only on the request, or on
it and a sidecar scope that thousands of proxies share, is worked out once per request
(``PushRequest.memoized``); per proxy only its own services are looked at.
"""

from __future__ import annotations

from meshpilot.model.kind import Kind
from meshpilot.model.proxy import NodeType, Proxy
from meshpilot.model.push_request import PushRequest
from meshpilot.model.sidecar_scope import SidecarScope
from meshpilot.xds.generators.base import memoized_by_identity

_GATEWAY_ONLY = frozenset({Kind.GATEWAY})
_GATEWAY_BOUND = frozenset({Kind.GATEWAY, Kind.VIRTUAL_SERVICE})
_SIDECAR_SCOPE = "scope-concerned-sidecar"
_SCOPE = "scope-concerned"
_ROUTES_ONLY = frozenset({Kind.VIRTUAL_SERVICE})


def proxy_needs_push(proxy: Proxy, request: PushRequest, root_namespace: str) -> bool:
    """Whether any config the request names concerns ``proxy``."""
    if request.forced or not request.configs_updated:
        return True
    kinds = request.updated_kinds
    # Any proxy may watch any Secret; the SDS generator sends only what the proxy watches and may have.
    if Kind.SECRET in kinds:
        return True
    sidecar = proxy.type is NodeType.SIDECAR
    # A sidecar is never pushed for a Gateway.
    if sidecar and kinds <= _GATEWAY_ONLY:
        return False
    # A router's scope holds no gateway-bound VirtualServices; any Gateway or VirtualService may
    # bind to it (which ones do is read when its listeners and routes are generated).
    if proxy.type is NodeType.ROUTER and not kinds.isdisjoint(_GATEWAY_BOUND):
        return True
    if proxy.sidecar_scope is None:
        return True
    # The proxy's own services always matter (its inbound config).
    if Kind.SERVICE_ENTRY in kinds and proxy.service_targets:
        changed = request.memoized(("service-entries",), lambda: _service_entries(request))
        if any((t.service.hostname, t.service.namespace) in changed for t in proxy.service_targets):
            return True
    if _scope_concerned(request, proxy.sidecar_scope, sidecar, root_namespace):
        return True
    previous = proxy.previous_scope
    return previous is not None and _scope_concerned(request, previous, sidecar, root_namespace)


def imports_kept(proxy: Proxy, request: PushRequest) -> bool:
    """Whether ``request`` changed only VirtualServices and a sidecar's scope, refreshed for it,
    imports the same services and DestinationRules as its previous scope.

    What else changed since the previous scope was made (a service, a rule, an identity) has a push
    of its own, which builds every type again; so the outputs that read of the snapshot only the
    scope's imports (clusters) are as they were. A VirtualService can change the imports: its
    destinations bring services into a Sidecar's scope."""
    if not request.full or request.is_everything or request.updated_kinds != _ROUTES_ONLY:
        return False
    scope, previous = proxy.sidecar_scope, proxy.previous_scope
    if proxy.type is not NodeType.SIDECAR or scope is None or previous is None:
        return False
    found: bool = memoized_by_identity(
        request.memoized,
        ("imports-kept", id(scope), id(previous)),
        (scope, previous),
        # By identity: both scopes hold their services, so no two of them share an id.
        lambda: scope.import_signature() == previous.import_signature(),
    )
    return found


def l4_routes_kept(proxy: Proxy, request: PushRequest) -> bool:
    """Whether none of the VirtualServices ``request`` changed has tcp or tls routes, as a sidecar's
    scope and previous scope see them, both a namespace's default scope (a Sidecar's egress
    listeners take the services they import one by one). Asked after ``imports_kept``."""
    scope, previous = proxy.sidecar_scope, proxy.previous_scope
    assert scope is not None and previous is not None
    if scope.config is not None or previous.config is not None:
        return False
    found: bool = memoized_by_identity(
        request.memoized,
        ("l4-routes-kept", id(scope), id(previous)),
        (scope, previous),
        lambda: not _changes_l4_routes(request, scope) and not _changes_l4_routes(request, previous),
    )
    return found


def _changes_l4_routes(request: PushRequest, scope: SidecarScope) -> bool:
    changed = request.configs_updated
    for listener in scope.egress:
        for vs in listener.virtual_services:
            spec = vs.config.spec
            if (spec.tcp or spec.tls) and (vs.config.key in changed or not vs.delegates.isdisjoint(changed)):
                return True
    return False


def _scope_concerned(request: PushRequest, scope: SidecarScope, sidecar: bool, root_namespace: str) -> bool:
    def concerned() -> bool:
        return any(
            scope.depends_on(key, root_namespace)
            for key in request.configs_updated
            if not (sidecar and key.kind is Kind.GATEWAY)
        )

    # The root namespace is in the key: the scope's answer for policy kinds depends on it.
    key = (_SIDECAR_SCOPE if sidecar else _SCOPE, root_namespace, id(scope))
    found: bool = memoized_by_identity(request.memoized, key, (scope,), concerned)
    return found


def _service_entries(request: PushRequest) -> frozenset[tuple[str, str]]:
    return frozenset((k.name, k.namespace) for k in request.configs_updated if k.kind is Kind.SERVICE_ENTRY)
