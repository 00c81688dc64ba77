"""ROUTE_CONFIGURATION, VIRTUAL_HOST and HTTP_ROUTE patches, in istiod's order (rc_patch.go).

A route configuration takes its MERGEs, then each virtual host its MERGE, REPLACE and REMOVE, then
within it each route its MERGE and REMOVE, then the route ADDs and INSERTs; VIRTUAL_HOST ADDs come
after every virtual host. Sidecars match a route configuration by ``name`` and by ``portNumber``
(read from its name: ``"9080"``, ``"host:9080"`` has none, ``inbound|9080||``); gateways also by
``portName`` and ``gateway`` (read from ``https.443.NAME.GATEWAY.NAMESPACE``), and a gateway's
``portNumber`` is that of a Gateway server, which the route name's port may map to.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from functools import partial
from typing import Any

from meshpilot.networking.envoyfilter import list_ops
from meshpilot.networking.envoyfilter.merge import merge as merge_value
from meshpilot.networking.envoyfilter.patches import ApplyTo, Context, Operation, Patch, PatchSet, is_merge
from meshpilot.networking.names import parse_cluster

ROUTE_KINDS = (ApplyTo.ROUTE_CONFIGURATION, ApplyTo.VIRTUAL_HOST, ApplyTo.HTTP_ROUTE)

#: RouteMatch.Action values and the Route oneof member each names.
_ACTIONS = {1: "route", 2: "redirect", 3: "direct_response"}
_ACTION_NAMES = frozenset(_ACTIONS.values())

#: A gateway's listen ports and the Gateway server ports served on each.
PortMap = Mapping[int, Collection[int]]


def _gateway_route_parts(name: str) -> tuple[int, str, str]:
    """(port, port name, ``namespace/gateway``) of a gateway route name, as istiod reads them."""
    if name.startswith("http."):
        return _int(name[len("http.") :]), "", ""
    if name.startswith("https.") and name.count(".") == 4:
        port, port_name, gateway, namespace = name[len("https.") :].split(".")
        return _int(port), port_name, f"{namespace}/{gateway}"
    return 0, "", ""


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 0


def _sidecar_route_port(name: str) -> int:
    if name.startswith("inbound"):
        parsed = parse_cluster(name)
        return parsed[1] if parsed else 0
    return _int(name)


def name_matches(name: str, patch: Patch, context: int, port_map: PortMap | None = None) -> bool:
    """Whether the route configuration ``name`` matches the patch's ``routeConfiguration`` match
    (istiod reads nothing else of it)."""
    if not patch.match.HasField("route_configuration"):
        return True
    wanted = patch.match.route_configuration
    if wanted.name and wanted.name != name:
        return False
    if context != Context.GATEWAY:
        return not (wanted.port_number and wanted.port_number != _sidecar_route_port(name))
    port, port_name, gateway = _gateway_route_parts(name)
    if wanted.port_name and wanted.port_name != port_name:
        return False
    if wanted.gateway and wanted.gateway != gateway:
        return False
    if wanted.port_number:
        served = (port_map or {}).get(port)
        return wanted.port_number in served if served is not None else bool(wanted.port_number == port)
    return True


def touches(name: str, patches: PatchSet, context: int, port_map: PortMap | None = None) -> bool:
    """Whether some patch applies to the route configuration ``name`` (only those are parsed)."""
    return any(
        patch.matches_context(context) and name_matches(name, patch, context, port_map)
        for kind in ROUTE_KINDS
        for patch in patches[kind]
    )


def _vhost_matches(vhost: Any, patch: Patch) -> bool:
    match = patch.match
    if not match.HasField("route_configuration") or not match.route_configuration.HasField("vhost"):
        return True
    wanted = match.route_configuration.vhost
    return (not wanted.name or wanted.name == vhost.name) and (
        not wanted.domain_name or wanted.domain_name in vhost.domains
    )


def _has_route_match(patch: Patch) -> bool:
    match = patch.match
    return bool(
        match.HasField("route_configuration")
        and match.route_configuration.HasField("vhost")
        and match.route_configuration.vhost.HasField("route")
    )


def _route_matches(route: Any, *, patch: Patch) -> bool:
    if not _has_route_match(patch):
        return True
    wanted = patch.match.route_configuration.vhost.route
    if wanted.name and wanted.name != route.name:
        return False
    action = route.WhichOneof("action")
    if wanted.action and action in _ACTION_NAMES:
        return bool(action == _ACTIONS.get(wanted.action))
    # Other actions (or none) match any action, as in istiod.
    return True


def patch_route_configuration(
    config: Any, patches: PatchSet, context: int, port_map: PortMap | None = None
) -> None:
    """Apply the route patches for ``context`` to ``config`` in place."""

    def applies(patch: Patch) -> bool:
        return patch.matches_context(context) and name_matches(config.name, patch, context, port_map)

    for patch in patches[ApplyTo.ROUTE_CONFIGURATION]:
        if is_merge(patch.operation) and applies(patch):
            merge_value(config, patch.value, patch.operation == Operation.MERGE_AND_REPLACE_LIST)
    vhost_patches = [p for p in patches[ApplyTo.VIRTUAL_HOST] if applies(p)]
    route_patches = [p for p in patches[ApplyTo.HTTP_ROUTE] if applies(p)]
    kept = []
    changed = False
    for vhost in config.virtual_hosts:
        current = vhost
        removed = False
        for patch in vhost_patches:
            if not _vhost_matches(current, patch):
                continue
            if patch.operation == Operation.REMOVE:
                removed = True
                break
            if is_merge(patch.operation):
                merge_value(current, patch.value, patch.operation == Operation.MERGE_AND_REPLACE_LIST)
            elif patch.operation == Operation.REPLACE:
                current = patch.copy_value()
                changed = True
        if removed:
            changed = True
            continue
        _patch_routes(current, route_patches)
        kept.append(current)
    for patch in vhost_patches:
        if patch.operation == Operation.ADD:
            kept.append(patch.copy_value())
            changed = True
    if changed:
        list_ops.replace_all(config.virtual_hosts, kept)


def _patch_routes(vhost: Any, patches: list[Patch]) -> None:
    patches = [p for p in patches if _vhost_matches(vhost, p)]
    if not patches:
        return
    routes = []
    for route in vhost.routes:
        removed = False
        for patch in patches:
            if not _route_matches(route, patch=patch):
                continue
            if patch.operation == Operation.REMOVE:
                removed = True
                break
            if is_merge(patch.operation):
                merge_value(route, patch.value, patch.operation == Operation.MERGE_AND_REPLACE_LIST)
        if not removed:
            routes.append(route)
    for patch in patches:
        has_match = _has_route_match(patch)
        if patch.operation == Operation.INSERT_FIRST:
            # With a route match, the route goes first only if some route matches.
            if not has_match or list_ops.first(routes, partial(_route_matches, patch=patch)) is not None:
                routes = [patch.copy_value(), *routes]
            continue
        if patch.operation in (Operation.ADD, Operation.INSERT_BEFORE, Operation.INSERT_AFTER):
            found = list_ops.apply(routes, patch, has_match, partial(_route_matches, patch=patch))
            if found is not None:
                routes = found
    list_ops.replace_all(vhost.routes, routes)
