"""Whether a push request concerns a proxy (istiod's ProxyNeedsPush)."""

from __future__ import annotations

from meshpilot.model.config import ConfigKey
from meshpilot.model.kind import Kind
from meshpilot.model.proxy import NodeType, Proxy
from meshpilot.model.push_request import PushRequest


def _concerns(proxy: Proxy, key: ConfigKey, root_namespace: str) -> bool:
    # Any proxy may watch any Secret; the SDS generator sends only what the proxy watches and may have.
    if key.kind is Kind.SECRET:
        return True
    if proxy.type is NodeType.SIDECAR and key.kind is Kind.GATEWAY:
        return False
    # A router's scope holds no gateway-bound VirtualServices; any Gateway or VirtualService may
    # bind to it (which ones do is read when its listeners and routes are generated).
    if proxy.type is NodeType.ROUTER and key.kind in (Kind.GATEWAY, Kind.VIRTUAL_SERVICE):
        return True
    # The proxy's own services always matter (its inbound config).
    if key.kind is Kind.SERVICE_ENTRY and any(
        t.service.hostname == key.name and t.service.namespace == key.namespace for t in proxy.service_targets
    ):
        return True
    for scope in (proxy.sidecar_scope, proxy.previous_scope):
        if scope is not None and scope.depends_on(key, root_namespace):
            return True
    return proxy.sidecar_scope is None


def proxy_needs_push(proxy: Proxy, request: PushRequest, root_namespace: str) -> bool:
    if request.forced or not request.configs_updated:
        return True
    return any(_concerns(proxy, key, root_namespace) for key in request.configs_updated)
