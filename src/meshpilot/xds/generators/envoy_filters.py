"""The generators' EnvoyFilter hooks: generated resources parsed, patched in istiod's order, encoded.

Only proxies some EnvoyFilter selects come here (``patch_set`` is None for the others after two
dictionary lookups), and only resources a patch may act on are parsed: a cluster or route
configuration whose name no patch matches keeps its bytes. The patched lists are shared, per
snapshot, by the proxies that read the same generated list with the same patches (the memo key
holds the input list's identity and the ``PatchSet``, which is itself shared), so a scope of a
thousand sidecars patches its clusters once.

Contexts, as istiod gives them: a sidecar's outbound clusters, BlackHoleCluster, PassthroughCluster,
outbound listeners and RDS route configurations are SIDECAR_OUTBOUND; its inbound clusters and
listeners, and the route configurations its inbound HTTP connection managers hold inline, are
SIDECAR_INBOUND; everything of a router is GATEWAY.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TypeVar

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from google.protobuf import any_pb2

from meshpilot.model.proxy import NodeType, Proxy
from meshpilot.model.push_context import PushContext
from meshpilot.networking import wire
from meshpilot.networking.envoyfilter import clusters, listeners, routes
from meshpilot.networking.envoyfilter.patches import ApplyTo, Context, PatchSet, patch_set
from meshpilot.networking.envoyfilter.problems import patch_failed
from meshpilot.networking.envoyfilter.routes import ROUTE_KINDS, PortMap
from meshpilot.networking.protobuf import serialize
from meshpilot.xds.generators.base import Resource, ResourceList, memoized_by_identity
from meshpilot.xds.types import TypeUrl

log = logging.getLogger(__name__)

T = TypeVar("T")

_INBOUND_PASSTHROUGH = "InboundPassthroughCluster"


def _parse(resource: Resource, message_type: type[T]) -> T:
    packed = any_pb2.Any.FromString(resource.payload)
    return message_type.FromString(packed.value)  # type: ignore[attr-defined,no-any-return]


def _failed(patches: PatchSet, what: str, err: Exception) -> None:
    for name in patches.filter_names:
        patch_failed(name, f"patching {what} failed, sent as generated: {err}")


# -- CDS -------------------------------------------------------------------------------------------


def _inbound_hosts(proxy: Proxy) -> tuple[tuple[int, tuple[str, ...]], ...]:
    """The hosts of the services the proxy serves, by inbound cluster port (what inbound clusters
    match a ``service`` by)."""
    by_port: dict[int, list[str]] = {}
    for target in proxy.service_targets:
        hosts = by_port.setdefault(target.target_port or target.port.port, [])
        if target.service.hostname not in hosts:
            hosts.append(target.service.hostname)
    return tuple(sorted((port, tuple(hosts)) for port, hosts in by_port.items()))


def patch_clusters(
    proxy: Proxy, push: PushContext, outbound: ResourceList, others: ResourceList, patches: PatchSet
) -> ResourceList:
    """The proxy's clusters (``outbound`` then ``others``) with the CLUSTER patches applied; the
    first cluster of a name wins, as in istiod."""
    router = proxy.type is NodeType.ROUTER
    hosts = () if router else _inbound_hosts(proxy)
    key = ("envoyfilter-cds", id(outbound), id(others), patches, router, hosts)
    return memoized_by_identity(
        push.memoized,
        key,
        (outbound, others),
        lambda: _clusters(outbound, others, patches, router, dict(hosts)),
    )


def _clusters(
    outbound: ResourceList,
    others: ResourceList,
    patches: PatchSet,
    router: bool,
    hosts: dict[int, tuple[str, ...]],
) -> ResourceList:
    out_context = Context.GATEWAY if router else Context.SIDECAR_OUTBOUND
    outward: list[Resource] = []
    inward: list[Resource] = []
    for resource in outbound:
        _patch_cluster(resource, patches, out_context, (), outward)
    for resource in others:
        name = resource.name
        if not router and (name.startswith("inbound|") or name == _INBOUND_PASSTHROUGH):
            port = _port(name)
            _patch_cluster(resource, patches, Context.SIDECAR_INBOUND, hosts.get(port, ()), inward)
        else:
            _patch_cluster(resource, patches, out_context, (), outward)
    outward.extend(Resource.of(c.name, c) for c in clusters.added_clusters(patches, out_context))
    if not router:
        added = clusters.added_clusters(patches, Context.SIDECAR_INBOUND)
        inward.extend(Resource.of(c.name, c) for c in added)
    return _first_of_each_name([*outward, *inward])


def _port(name: str) -> int:
    parts = name.split("|")
    return int(parts[1]) if len(parts) == 4 and parts[1].isdigit() else 0


def _patch_cluster(
    resource: Resource, patches: PatchSet, context: int, hosts: tuple[str, ...], out: list[Resource]
) -> None:
    if not clusters.touches(resource.name, patches, context, hosts):
        out.append(resource)
        return
    try:
        cluster = clusters.patch_cluster(_parse(resource, cluster_pb2.Cluster), patches, context, hosts)
    except Exception as err:  # any failing patch, as istiod recovers: counted, resource sent as built
        _failed(patches, f"cluster {resource.name}", err)
        out.append(resource)
        return
    if cluster is not None:
        out.append(Resource.of(cluster.name, cluster))


def _first_of_each_name(resources: list[Resource]) -> ResourceList:
    seen: set[str] = set()
    out = []
    for resource in resources:
        if resource.name not in seen:
            seen.add(resource.name)
            out.append(resource)
    return ResourceList(out)


# -- LDS -------------------------------------------------------------------------------------------


def patch_listeners(
    push: PushContext, resources: ResourceList, patches: PatchSet, context: int
) -> ResourceList:
    """Listeners of one context with the listener patches (and, inbound, the inline route patches)
    applied, then the listeners ADD patches insert."""
    key = ("envoyfilter-lds", id(resources), patches, context)
    return memoized_by_identity(
        push.memoized, key, (resources,), lambda: _listeners(resources, patches, context)
    )


def _listeners(resources: ResourceList, patches: PatchSet, context: int) -> ResourceList:
    inline_routes = context == Context.SIDECAR_INBOUND and patches.has(*ROUTE_KINDS)
    out = []
    for resource in resources:
        if not inline_routes and not listeners.may_touch(resource.name, patches, context):
            out.append(resource)
            continue
        try:
            listener = _parse(resource, listener_pb2.Listener)
            if inline_routes:
                listeners.patch_inline_routes(listener, patches, context)
            if listeners.patch_listener(listener, patches, context):
                continue
        except Exception as err:  # any failing patch, as istiod recovers: counted, resource sent as built
            _failed(patches, f"listener {resource.name}", err)
            out.append(resource)
            continue
        out.append(Resource.of(listener.name, listener))
    out.extend(Resource.of(li.name, li) for li in listeners.added_listeners(patches, context))
    return ResourceList(out)


def has_listener_patches(patches: PatchSet | None, inbound: bool) -> bool:
    if patches is None:
        return False
    return patches.has(*listeners.LISTENER_KINDS) or (inbound and patches.has(*ROUTE_KINDS))


# -- RDS -------------------------------------------------------------------------------------------


def gateway_port_map(proxy: Proxy, push: PushContext) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """A router's listen ports and the Gateway server ports served on each (a Service's targetPort
    moves a server port to another listen port)."""
    targets = {t.port.port: t.target_port for t in proxy.service_targets if t.target_port}
    by_listen: dict[int, set[int]] = {}
    for server in push.merged_gateway(proxy).servers:
        by_listen.setdefault(targets.get(server.port, server.port), set()).add(server.port)
    return tuple(sorted((port, tuple(sorted(ports))) for port, ports in by_listen.items()))


def patch_route_resources(
    proxy: Proxy, push: PushContext, resources: list[Resource], patches: PatchSet
) -> list[Resource]:
    """Route configurations with the route patches applied, each encoded once per snapshot for
    every proxy that holds the same bytes and patches."""
    router = proxy.type is NodeType.ROUTER
    context = Context.GATEWAY if router else Context.SIDECAR_OUTBOUND
    port_map = gateway_port_map(proxy, push) if router else ()
    ports: PortMap = {port: frozenset(servers) for port, servers in port_map}
    out = []
    for resource in resources:
        if not routes.touches(resource.name, patches, context, ports):
            out.append(resource)
            continue
        key = ("envoyfilter-rds", resource.name, resource.payload, patches, context, port_map)
        payload = push.memoized(key, partial(_patched_route, resource, patches, context, ports))
        out.append(Resource(resource.name, payload))
    return out


def _patched_route(resource: Resource, patches: PatchSet, context: int, ports: PortMap) -> bytes:
    try:
        config = _parse(resource, route_pb2.RouteConfiguration)
        routes.patch_route_configuration(config, patches, context, ports)
    except Exception as err:  # any failing patch, as istiod recovers: counted, resource sent as built
        _failed(patches, f"route configuration {resource.name}", err)
        return resource.payload
    return wire.any_bytes(TypeUrl.ROUTE, serialize(config))


def report_proxyless(proxy: Proxy, push: PushContext) -> None:
    """Count the EnvoyFilters that select a proxyless gRPC client: it takes none of their patches."""
    patches = patch_set(proxy, push)
    for name in patches.filter_names if patches is not None else ():
        patch_failed(name, "not applied to proxyless gRPC clients (istiod applies none to them either)")


def has_route_patches(patches: PatchSet | None) -> bool:
    return patches is not None and patches.has(*ROUTE_KINDS)


def has_cluster_patches(patches: PatchSet | None) -> bool:
    return patches is not None and patches.has(ApplyTo.CLUSTER)


__all__ = [
    "has_cluster_patches",
    "has_listener_patches",
    "has_route_patches",
    "patch_clusters",
    "patch_listeners",
    "patch_route_resources",
    "report_proxyless",
]
