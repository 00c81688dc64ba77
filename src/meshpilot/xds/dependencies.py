"""Whether a push request concerns a proxy (istiod's ProxyNeedsPush), and what a VirtualService's
push leaves of a sidecar's clusters and listeners (``clusters_kept``, ``listeners_kept``).

A push asks this of every proxy with the same request, so what depends only on the request, or on
it and a sidecar scope that thousands of proxies share, is worked out once per request
(``PushRequest.memoized``); per proxy only its own services are looked at.
"""

from __future__ import annotations

from meshpilot.model.kind import Kind
from meshpilot.model.proxy import NodeType, Proxy
from meshpilot.model.push_context import same_token
from meshpilot.model.push_request import PushRequest
from meshpilot.model.sidecar_scope import SidecarScope
from meshpilot.networking.auto_mtls import mode_reads_endpoints
from meshpilot.networking.tcp_routes import listeners_read
from meshpilot.xds.generators.base import memoized_by_identity

_GATEWAY_ONLY = frozenset({Kind.GATEWAY})
_GATEWAY_BOUND = frozenset({Kind.GATEWAY, Kind.VIRTUAL_SERVICE})
_SIDECAR_SCOPE = "scope-concerned-sidecar"
_SCOPE = "scope-concerned"
_VIRTUAL_SERVICES_ONLY = frozenset({Kind.VIRTUAL_SERVICE})
#: A scope's memo: whether any of its clusters reads endpoints (``_same_clusters``).
_READS_ENDPOINTS = "clusters-read-endpoints"


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


def clusters_kept(proxy: Proxy, request: PushRequest) -> bool:
    """Whether a sidecar's clusters, built for its refreshed scope, would be what they were for its
    previous scope, for a full push whose changes are all VirtualServices (which clusters do not read).

    The snapshot may hold changes the request does not name (made after it was merged; their own push
    may reach nobody), so the snapshots are compared: the same objects of every other kind, services
    and MeshConfig (``SidecarScope.snapshot_token``), the workload not read again, the same imported
    services and DestinationRules (a destination can bring a service in), and no cluster that reads
    endpoints, which change between full pushes (DNS, passthrough auto mTLS)."""
    if not request.full or request.is_everything or request.updated_kinds != _VIRTUAL_SERVICES_ONLY:
        return False
    state = proxy.state
    scope, previous = state.sidecar_scope, state.previous_scope
    if proxy.type is not NodeType.SIDECAR or scope is None or previous is None or state.workload_reread:
        return False
    found: bool = memoized_by_identity(
        request.memoized,
        ("clusters-kept", id(scope), id(previous)),
        (scope, previous),
        lambda: _same_clusters(scope, previous),
    )
    return found


def listeners_kept(proxy: Proxy, request: PushRequest) -> bool:
    """Whether a sidecar's listeners would be what they were, for the push ``clusters_kept`` is asked
    of: when its clusters would, both scopes are a namespace's default one (a Sidecar's egress
    listeners each import services of their own, which a destination can change without changing
    the scope's whole imports), and they hold the same VirtualServices that listeners read
    (``tcp_routes.listeners_read``)."""
    if not clusters_kept(proxy, request):
        return False
    scope, previous = proxy.sidecar_scope, proxy.previous_scope
    assert scope is not None and previous is not None
    if scope.config is not None or previous.config is not None:
        return False
    # By identity: a config object is never edited, and both scopes hold theirs. A VirtualService
    # with delegates is merged anew for each snapshot, so never compares the same.
    return _l4_routes(scope) == _l4_routes(previous)


def _same_imports(scope: SidecarScope, previous: SidecarScope) -> bool:
    # Services by identity: both scopes hold theirs, so no two of them share an id.
    return same_token(scope.snapshot_token, previous.snapshot_token) and (
        scope.import_signature() == previous.import_signature()
    )


def _same_clusters(scope: SidecarScope, previous: SidecarScope) -> bool:
    """Whether ``scope`` imports what ``previous`` did and none of its clusters reads endpoints.

    With the same imports (the same services, DestinationRules and MeshConfig), ``previous``'s answer
    to the second question, when it has one, is this scope's too: carried from scope to scope, the
    imported services are walked for a scope whose imports are new, not for every namespace's scope
    of every snapshot (a thousand services each, per full push)."""
    if not _same_imports(scope, previous):
        return False
    found = scope.memo.get(_READS_ENDPOINTS)
    if found is None:
        found = previous.memo.get(_READS_ENDPOINTS)
        if found is None:
            found = scope.has_dns or any(
                mode_reads_endpoints(svc, scope.destination_rule(svc.hostname)) for svc in scope.services
            )
        scope.memo[_READS_ENDPOINTS] = found
    return not found


def _l4_routes(scope: SidecarScope) -> tuple[tuple[int, ...], ...]:
    found = scope.memo.get("l4-routes")
    if found is None:
        found = scope.memo["l4-routes"] = tuple(
            tuple(id(vs.config) for vs in listener.virtual_services if listeners_read(vs.config.spec))
            for listener in scope.egress
        )
    assert isinstance(found, tuple)
    return found


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
