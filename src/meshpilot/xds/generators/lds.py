"""LDS: listeners, rebuilt on full pushes whose changes can affect them.

Outbound listeners are shared, per snapshot, by the proxies of scopes with the
same outbound signature (``_outbound_signature``: usually every namespace without
a Sidecar) and the same capabilities (and, with headless services, the same
addresses), but for their HCMs' tracing, which names the workload: they are
built once per signature and re-traced per distinct tracing (``filters.retraced``).
Inbound listeners are shared by the proxies that serve the same ports.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from functools import partial
from typing import Any

from meshpilot.model.kind import Kind
from meshpilot.model.proxy import NodeType, Proxy
from meshpilot.model.push_request import PushRequest
from meshpilot.model.sidecar_scope import SidecarScope
from meshpilot.networking import tracing
from meshpilot.networking.envoyfilter.patches import Context, patch_set
from meshpilot.networking.filters import holds_hcm, retraced
from meshpilot.networking.gateway import gateway_listeners, service_port_map
from meshpilot.networking.listener import build_outbound_listeners
from meshpilot.networking.listener_inbound import build_inbound_listeners
from meshpilot.networking.tcp_routes import source_label_key, uses_source_namespace
from meshpilot.networking.tracing import HcmTracing
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.dependencies import listeners_kept
from meshpilot.xds.generators.base import (
    GenerationContext,
    Resource,
    ResourceList,
    joined,
    names_of,
    only_kinds,
    same_list,
    shared_token,
)
from meshpilot.xds.generators.envoy_filters import has_listener_patches, patch_listeners
from meshpilot.xds.generators.lds_keys import listener_keys, telemetry_key
from meshpilot.xds.types import TypeUrl

log = logging.getLogger(__name__)


#: What becomes of a list of listeners once made (``_shared``).
_Keep = Callable[[ResourceList], ResourceList]


def _as_made(resources: ResourceList) -> ResourceList:
    return resources


class _Traced:
    """Listeners as built for the first of the workloads sharing them, with the tracing they were
    built with and those of them that hold HCMs (which another workload's tracing changes)."""

    __slots__ = ("resources", "traced", "tracing")

    def __init__(self, tracing: HcmTracing, listeners: list[Any], keep: _Keep) -> None:
        self.tracing = tracing
        self.resources = keep(ResourceList(Resource.of(li.name, li) for li in listeners))
        self.traced = [(i, li) for i, li in enumerate(listeners) if holds_hcm(li)]

    def with_tracing(self, tracing: HcmTracing) -> ResourceList:
        out = list(self.resources)
        for i, listener in self.traced:
            copy = retraced(listener, tracing)
            out[i] = Resource.of(copy.name, copy)
        # Retracing renames nothing: the template's name set serves the copy too.
        return ResourceList(out, names=self.resources.names)


def _shared(
    memo: Callable[[Hashable, Callable[[], Any]], Any],
    key: Hashable,
    tracing: HcmTracing,
    build: Callable[[], list[Any]],
    keep: _Keep = _as_made,
) -> ResourceList:
    """Listeners shared under ``key`` by workloads whose HCMs differ only in ``tracing``; each list
    made passes through ``keep`` (``same_list``, for lists made again for every snapshot)."""
    template: _Traced = memo(key, lambda: _Traced(tracing, build(), keep))
    if template.tracing.fingerprint == tracing.fingerprint:
        return template.resources
    found: ResourceList = memo((key, tracing.fingerprint), lambda: keep(template.with_tracing(tracing)))
    return found


def _outbound_signature(scope: SidecarScope) -> Hashable:
    """All the outbound listeners read of a scope (``build_outbound_listeners``; of the proxy, the key
    names the rest): each egress listener with the services and VirtualServices it takes, the
    scope's imports (routes resolve destinations and rules there), where the catch-all chain goes,
    and the namespace when a tcp or tls route matches on it. A Sidecar's scope is its own: it names
    ports, binds and an egress proxy of its own."""
    if scope.config is not None:
        return ("sidecar", id(scope))
    uses_namespace = any(uses_source_namespace(e.virtual_services) for e in scope.egress)
    return (
        scope.import_signature(),
        tuple(
            (
                e.port is None,
                e.bind,
                e.capture_mode,
                tuple(map(id, e.services)),
                tuple(map(id, e.virtual_services)),
            )
            for e in scope.egress
        ),
        scope.outbound_traffic_policy,
        scope.namespace if uses_namespace else "",
    )


# Gateway changes reach only routers (see dependencies.proxy_needs_push), whose listeners they make.
_SKIPPED = frozenset({Kind.WORKLOAD_ENTRY, Kind.WORKLOAD_GROUP})


class ListenerGenerator:
    type_url = TypeUrl.LISTENER

    def needs_push(self, request: PushRequest) -> bool:
        return request.full and not only_kinds(request, _SKIPPED)

    def kept_for(self, proxy: Proxy, request: PushRequest) -> bool:
        return listeners_kept(proxy, request)

    def generate(
        self, ctx: GenerationContext, watch: WatchedResource, names: frozenset[str] | None
    ) -> list[Resource] | None:
        proxy, push = ctx.proxy, ctx.push
        if proxy.type is NodeType.ROUTER:
            return self._gateway(ctx)
        scope = proxy.sidecar_scope
        assert scope is not None
        # Headless services get a listener per endpoint, except the proxy's own address.
        headless = (proxy.ip_addresses, ctx.index.generation) if scope.has_headless else None
        # Keys name everything the listeners read but their HCMs' tracing (see _shared).
        keys = listener_keys(proxy, push, watch, ctx.cache)
        fingerprint, loggers = keys.telemetry
        outbound = _shared(
            push.memoized,
            (
                "lds-out",
                shared_token(push, scope, "lds-out", partial(_outbound_signature, scope)),
                proxy.capabilities,
                headless,
                source_label_key(proxy),
                fingerprint,
                loggers,
            ),
            keys.client_tracing,
            lambda: build_outbound_listeners(proxy, push, ctx.index),
            # Made again for each snapshot: kept as the previous one's while the same. Not when the
            # list is the proxy's own (headless services): an entry per proxy would only hold memory.
            partial(same_list, push) if headless is None else _as_made,
        )
        inbound_key = (
            "lds-in",
            proxy.capabilities,
            proxy.inbound_signature,
            # The AuthorizationPolicies and RequestAuthentications selecting it, and fetched JWKS.
            keys.security,
            # The workload's PeerAuthentication: each port's chains (it follows the labels too).
            keys.mtls,
            # The Telemetry objects in its scope (with their specs: this key outlives the snapshot).
            fingerprint,
            loggers,
        )
        if scope.has_ingress:
            # Sidecar ingress listeners come from the scope and bind the proxy's own address by default.
            inbound = _shared(
                push.memoized,
                (inbound_key, id(scope), proxy.ip_addresses),
                keys.server_tracing,
                lambda: build_inbound_listeners(proxy, push),
            )
        else:
            # Without a Sidecar, inbound listeners read only what the key names (and the mesh).
            inbound = _shared(
                push.memoized_lasting,
                inbound_key,
                keys.server_tracing,
                lambda: build_inbound_listeners(proxy, push),
            )
        patches = patch_set(proxy, push)
        if patches is not None:
            if has_listener_patches(patches, inbound=False):
                outbound = patch_listeners(push, outbound, patches, Context.SIDECAR_OUTBOUND)
            if has_listener_patches(patches, inbound=True):
                inbound = patch_listeners(push, inbound, patches, Context.SIDECAR_INBOUND)
        # The lists' own name sets: computed once per list, which the proxies of a scope share.
        outbound_names = names_of(outbound)
        if len(outbound_names) == len(outbound) and outbound_names.isdisjoint(names_of(inbound)):
            # Headless services and Sidecar ingress make a part the proxy's own.
            own = headless is not None or scope.has_ingress
            return ResourceList.joined(outbound, inbound) if own else joined(push, outbound, inbound)
        taken = {r.name for r in inbound}
        kept = []
        for resource in outbound:
            # Envoy rejects a whole update with two listeners of one name; an
            # explicit Sidecar ingress port wins over an outbound service port.
            if resource.name in taken:
                log.warning(
                    "%s: outbound listener %s conflicts with an inbound listener; skipped",
                    proxy.id,
                    resource.name,
                )
                continue
            taken.add(resource.name)
            kept.append(resource)
        return [*kept, *inbound]

    def _gateway(self, ctx: GenerationContext) -> ResourceList:
        proxy, push = ctx.proxy, ctx.push
        # What the listeners read besides the snapshot: the Gateways (chosen by the labels, which
        # TCP and TLS matches may also name), the namespace (VirtualService visibility), and the
        # Service ports that map Gateway ports. Gateway replicas share all of it.
        ports = service_port_map(proxy)
        key = (
            "lds-gw",
            frozenset(proxy.labels.items()),
            proxy.config_namespace,
            proxy.capabilities,
            ports,
            telemetry_key(proxy, push),
            # Its tracing: Istio's tags name the gateway's workload.
            tracing.key(push, proxy),
        )
        generated = push.memoized(
            key, lambda: ResourceList(Resource.of(li.name, li) for li in gateway_listeners(proxy, push))
        )
        patches = patch_set(proxy, push)
        if has_listener_patches(patches, inbound=False):
            assert patches is not None
            return patch_listeners(push, generated, patches, Context.GATEWAY)
        return generated
