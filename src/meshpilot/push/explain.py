"""Push explanation: why a proxy got each of its last pushes, and which Istio objects made one of its
resources.

``pushes`` reads the push history (``push.history``): for each recent push the proxy got, the events
that set it off, what was sent to this proxy (types, names, what was removed, bytes), and for each
event why it concerned this proxy. That last part is worked out now, from the current model, with the
rule the push applies (``xds.dependencies``): the proxy's scope (its Sidecar or the namespace's
default), how the changed object reaches that scope (an imported service, a VirtualService of an
egress listener, the DestinationRule of an imported host, a policy of the proxy's or the root
namespace), and the object's ``exportTo``. For a gateway the words first say how the object reaches
its Gateways (``push.explain_gateway``): the Gateway selecting it, the VirtualService bound to one,
the destination of such a VirtualService, the Secret a server names. Since the model may have moved
on since the push, the answer says it is the current one.

``resource`` goes the other way, for one resource the proxy holds: the objects of the current
PushContext that produced it. A cluster: its service (Kubernetes Service or ServiceEntry), the
DestinationRules merged for its host and the subset used, the EnvoyFilters whose cluster patches
select it, and on a gateway the bound VirtualServices that route to it. A sidecar's route
configuration: the services on the port, the VirtualServices of the egress listener that cover them,
DestinationRules that add hash policies, route EnvoyFilters. A gateway's (``http.<port>``,
``https.<port>.<name>.<gateway>.<namespace>``): the Gateway servers behind it and the VirtualServices
bound to them with the hosts each serves. A sidecar listener: the services on its port (outbound) or
the proxy's own service ports (inbound), the Sidecar, and the PeerAuthentications,
AuthorizationPolicies and RequestAuthentications that select the workload; a gateway listener: the
Gateway servers on its port (TLS mode, credentialName, what they route) and the policies. Both list
the listener EnvoyFilters. Endpoints: the service and its endpoint shards by source. All of it comes
from the indexes generation uses, not from reading names.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable
from typing import Any

from meshpilot.model.authorization import authorization_policies, request_authentications
from meshpilot.model.config import ConfigKey
from meshpilot.model.kind import Kind
from meshpilot.model.labels import selector_matches
from meshpilot.model.proxy import NodeType, Proxy
from meshpilot.model.push_context import PushContext
from meshpilot.model.service import Service
from meshpilot.model.sidecar_scope import NAMESPACED_POLICY_KINDS, SCOPED_KINDS, SidecarScope
from meshpilot.networking import names
from meshpilot.networking.envoyfilter.clusters import name_matches as name_matches_cluster
from meshpilot.networking.envoyfilter.listeners import LISTENER_KINDS
from meshpilot.networking.envoyfilter.patches import ApplyTo, Context, Operation, Patch, patch_set
from meshpilot.networking.envoyfilter.routes import ROUTE_KINDS
from meshpilot.networking.envoyfilter.routes import name_matches as name_matches_route
from meshpilot.networking.route import hosts_for_virtual_service, parse_route_name, route_cache_parts
from meshpilot.networking.vhosts import services_on_port
from meshpilot.push import explain_gateway
from meshpilot.push.explain_gateway import config_ref as _ref
from meshpilot.push.history import ConfigChange, PushHistory
from meshpilot.xds.connection import Connection
from meshpilot.xds.generators.envoy_filters import gateway_port_map

#: Names listed per type and push; the count says how many there were.
MAX_NAMES = 50

_KINDS_BY_NAME = {k.value: k for k in Kind}


def _iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat().replace("+00:00", "Z")


def scope_name(scope: SidecarScope, router: bool = False) -> str:
    if scope.config is not None:
        return f"Sidecar {scope.config.namespace}/{scope.config.name}"
    why = "gateways take no Sidecar" if router else "no Sidecar selects it"
    return f"the default scope of namespace {scope.namespace} ({why})"


def _export(export_to: Iterable[str]) -> str:
    found = sorted(export_to)
    return "exportTo " + (", ".join(found) if found else "(mesh default)")


# -- why a change concerned a proxy -------------------------------------------------------------


def why_in_scope(proxy: Proxy, key: ConfigKey, push: PushContext) -> tuple[bool, str]:
    """Whether a change to ``key`` concerns ``proxy`` under the current model, and why, in words.

    The verdict is ``xds.dependencies``' rule, asked the same way; the words say which part of it
    matched. For a gateway they first say how the object reaches its Gateways
    (``push.explain_gateway``)."""
    concerned, why = _why_in_scope(proxy, key, push)
    if proxy.type is NodeType.ROUTER and concerned:
        gateway = explain_gateway.why(proxy, key, push)
        if gateway is not None:
            # The scope's words still matter after a rule or service: a gateway gets the clusters
            # of every service its scope imports, routed to or not.
            scoped = key.kind in (Kind.DESTINATION_RULE, Kind.SERVICE_ENTRY)
            why = f"{gateway}; and {why}" if scoped else gateway
    return concerned, why


def _why_in_scope(proxy: Proxy, key: ConfigKey, push: PushContext) -> tuple[bool, str]:
    root = push.mesh.root_namespace
    scope = proxy.sidecar_scope
    router = proxy.type is NodeType.ROUTER
    if key.kind is Kind.SECRET:
        return True, "any proxy may watch a Secret; SDS sends it only to those that do"
    if proxy.type is NodeType.SIDECAR and key.kind is Kind.GATEWAY:
        return False, "sidecars take no Gateway"
    if router and key.kind in (Kind.GATEWAY, Kind.VIRTUAL_SERVICE):
        return True, "a gateway takes every Gateway and VirtualService that may bind to it"
    if key.kind is Kind.SERVICE_ENTRY:
        for target in proxy.service_targets:
            if target.service.hostname == key.name and target.service.namespace == key.namespace:
                return True, f"the proxy serves {key.name} on port {target.port.port} (its inbound config)"
    if scope is None:
        return True, "no scope was computed for it yet: every change concerns it"
    where = scope_name(scope, router)
    if key.kind is Kind.PEER_AUTHENTICATION and key.namespace in scope.service_namespaces:
        if key.namespace in (scope.namespace, root):
            return True, f"a PeerAuthentication of {_namespace_role(key.namespace, scope, root)}"
        return True, (
            f"a PeerAuthentication of namespace {key.namespace}, where services {where} imports live "
            "(clients follow their servers' mTLS modes)"
        )
    if key.kind in NAMESPACED_POLICY_KINDS:
        if key.namespace in (scope.namespace, root):
            return True, f"a {key.kind.value} of {_namespace_role(key.namespace, scope, root)}"
        return False, f"a {key.kind.value} of namespace {key.namespace}, neither the proxy's nor the root"
    if key.kind not in SCOPED_KINDS:
        return True, f"a {key.kind.value} change concerns every proxy"
    if key not in scope.dependencies:
        previous = proxy.previous_scope
        if previous is not None and previous.depends_on(key, root):
            return True, f"it was in the proxy's previous scope ({scope_name(previous, router)})"
        return False, f"{where} does not import it"
    return True, f"{where} {_dependency(scope, key, push)}"


def _namespace_role(namespace: str, scope: SidecarScope, root: str) -> str:
    if namespace == scope.namespace:
        return f"the proxy's own namespace {namespace}"
    return f"the root namespace {root} (mesh-wide)"


def _dependency(scope: SidecarScope, key: ConfigKey, push: PushContext) -> str:
    """How ``key``, one of the scope's dependencies, got there."""
    if key.kind is Kind.SIDECAR:
        return "is that Sidecar"
    if key.kind is Kind.SERVICE_ENTRY:
        svc = scope.service(key.name)
        if svc is None:
            return f"imports {key.name}"
        how = _how_imported(scope, svc)
        return f"imports {svc.hostname} ({svc.namespace}, {_export(push.service_export_to(svc))}) {how}"
    if key.kind is Kind.VIRTUAL_SERVICE:
        for listener in scope.egress:
            for vs in listener.virtual_services:
                port = f"port {listener.port.number}" if listener.port is not None else "every port"
                if vs.config.key == key:
                    return (
                        f"imports VirtualService {key.namespace}/{key.name} for {', '.join(vs.hosts)} "
                        f"({_export(vs.export_to)}) on its egress listener for {port}"
                    )
                if key in vs.delegates:
                    return (
                        f"imports VirtualService {vs.config.namespace}/{vs.config.name}, which delegates to "
                        f"{key.namespace}/{key.name}"
                    )
        return f"imports VirtualService {key.namespace}/{key.name}"
    if key.kind is Kind.DESTINATION_RULE:
        hosts = []
        export_to: frozenset[str] = frozenset()
        for svc in scope.services:
            for entry in push.destination_rules.lookup(scope.namespace, svc.hostname, svc.namespace):
                if any(c.key == key for c in entry.configs):
                    hosts.append(svc.hostname)
                    export_to = entry.export_to
        if hosts:
            rule = f"DestinationRule {key.namespace}/{key.name}"
            return f"imports {', '.join(sorted(set(hosts)))}, to which {rule} applies ({_export(export_to)})"
    return f"depends on {key.kind.value} {key.namespace}/{key.name}"


def _how_imported(scope: SidecarScope, svc: Service) -> str:
    for listener in scope.egress:
        if any(s.hostname == svc.hostname and s.namespace == svc.namespace for s in listener.services):
            hosts = [f"{ns}/{h}" for ns, imports in sorted(listener.imports.items()) for h in imports.hosts]
            if scope.config is None:
                return "(every visible service)"
            return f"(egress hosts {', '.join(hosts)})"
    return "(a destination of an imported VirtualService)"


# -- the pushes -----------------------------------------------------------------------------


def _change_json(change: ConfigChange, proxy: Proxy | None, push: PushContext | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "kind": change.kind,
        "namespace": change.namespace,
        "name": change.name,
        "change": change.change,
    }
    kind = _KINDS_BY_NAME.get(change.kind)
    if proxy is not None and push is not None and kind is not None:
        concerned, why = why_in_scope(proxy, ConfigKey(kind, change.name, change.namespace), push)
        out["concerns"] = concerned
        out["why"] = why
    return out


def pushes(
    history: PushHistory, conn: Connection | None, proxy_id: str, push: PushContext | None, limit: int = 10
) -> dict[str, Any]:
    """The last ``limit`` pushes ``proxy_id`` got, newest first, explained (see the module)."""
    proxy = conn.proxy if conn is not None else None
    out: dict[str, Any] = {"proxy": proxy_id, "connected": conn is not None}
    if proxy is not None and proxy.sidecar_scope is not None:
        out["scope"] = scope_name(proxy.sidecar_scope, proxy.type is NodeType.ROUTER)
    if push is not None:
        out["modelVersion"] = push.version
        if proxy is not None and proxy.type is NodeType.ROUTER:
            out["gateways"] = explain_gateway.selecting_gateways(proxy, push)
            out["gatewaySelection"] = explain_gateway.SELECTION
    entries = []
    for record, sent in history.for_proxy(proxy_id, limit):
        types = []
        for s in sent.sent:
            listed = sorted(s.names)
            entry: dict[str, Any] = {"type": s.type, "count": len(listed), "bytes": s.bytes}
            entry["names"] = listed[:MAX_NAMES]
            removed = list(s.removed)
            if removed:
                entry["removed"] = removed[:MAX_NAMES]
            types.append(entry)
        entries.append(
            {
                "push": record.number,
                # A push worker's own push is "7+1": after push 7, not push 7 (``PushRecord.label``).
                "label": record.label,
                "version": record.version,
                "started": _iso(record.started),
                "full": record.full,
                "reasons": dict(record.reasons),
                "merged": record.merged,
                "trigger": record.trigger,
                "changes": [_change_json(c, proxy, push) for c in record.changes],
                "changesNotListed": record.changes_dropped,
                "sent": types,
                "bytes": sent.bytes,
                "seconds": round(sent.duration_s, 6),
            }
        )
    out["pushes"] = entries
    return out


# -- which objects made a resource -------------------------------------------------------------


def _patches(
    proxy: Proxy, push: PushContext, kinds: Iterable[int], fits: Callable[[Patch], bool]
) -> list[str]:
    """The EnvoyFilter patches the proxy takes (``envoyfilter.patches.patch_set``, as generation picks
    them) of ``kinds`` that ``fits`` says apply to the resource."""
    patches = patch_set(proxy, push)
    if patches is None:
        return []
    out: dict[str, None] = {}
    for kind in kinds:
        for patch in patches[kind]:
            if fits(patch):
                what = f"{ApplyTo.Name(patch.apply_to)} {Operation.Name(patch.operation)}"
                out[f"EnvoyFilter {patch.filter_name} ({what})"] = None
    return list(out)


def _context(proxy: Proxy, inbound: bool) -> int:
    if proxy.type is not NodeType.SIDECAR:
        return int(Context.GATEWAY)
    return int(Context.SIDECAR_INBOUND if inbound else Context.SIDECAR_OUTBOUND)


def _service_json(svc: Service, push: PushContext) -> dict[str, Any]:
    return {
        "registry": svc.registry.value,
        "hostname": svc.hostname,
        "namespace": svc.namespace,
        "name": svc.name,
        "exportTo": sorted(push.service_export_to(svc)),
    }


def _cluster(proxy: Proxy, push: PushContext, name: str) -> dict[str, Any]:
    parsed = names.parse_cluster(name)
    scope = proxy.sidecar_scope
    direction, port, subset, host = parsed or ("", 0, "", "")
    out: dict[str, Any] = {"direction": direction, "port": port} if parsed else {}
    if parsed is None:
        # Not a service's cluster: built in, or added by an EnvoyFilter (listed below).
        out["from"] = _builtin(name, scope)
    elif direction == "inbound":
        targets = [t for t in proxy.service_targets if t.port.port == port or t.target_port == port]
        out["services"] = [_service_json(t.service, push) for t in targets]
        if scope is not None and scope.config is not None and scope.has_ingress:
            out["sidecar"] = _ref(scope.config)
    else:
        svc = scope.service(host) if scope is not None else None
        out["service"] = _service_json(svc, push) if svc is not None else None
        rule = scope.destination_rule(host) if scope is not None else None
        if rule is not None:
            out["destinationRules"] = [_ref(c) for c in rule.configs]
            if subset:
                out["subset"] = {
                    "name": subset,
                    "from": next(
                        (_ref(c) for c in rule.configs if any(s.name == subset for s in c.spec.subsets)), None
                    ),
                }
        elif subset:
            out["subset"] = {"name": subset, "from": None}
        if proxy.type is NodeType.ROUTER and names.is_sni_cluster(name):
            out["from"] = (
                "an SNI-DNAT cluster of the AUTO_PASSTHROUGH servers: mesh mTLS passes through to the "
                "service, chosen by SNI"
            )
        elif proxy.type is NodeType.ROUTER:
            # A gateway gets a cluster for every service its scope imports (as istiod, without
            # PILOT_FILTER_GATEWAY_CLUSTER_CONFIG); these are the routes that use this one.
            out["routedBy"] = explain_gateway.routed_by(proxy, push, host, port)

    context = _context(proxy, direction == "inbound")
    hosts = [t.service.hostname for t in proxy.service_targets]

    def fits(patch: Patch) -> bool:
        if not patch.matches_context(context):
            return False
        if patch.operation == Operation.ADD:
            return patch.value is not None and patch.value.name == name
        return name_matches_cluster(name, patch, hosts)

    out["envoyFilters"] = _patches(proxy, push, (ApplyTo.CLUSTER,), fits)
    return out


def _builtin(name: str, scope: SidecarScope | None) -> str:
    if name in ("BlackHoleCluster", "PassthroughCluster"):
        where = scope_name(scope) if scope is not None and scope.config is not None else "MeshConfig"
        return f"built in; outboundTrafficPolicy of {where} decides whether it is used"
    return "not made from a service (built in, or added by the EnvoyFilters listed)"


def _route(proxy: Proxy, push: PushContext, name: str) -> dict[str, Any]:
    context = _context(proxy, inbound=False)
    if proxy.type is NodeType.ROUTER:
        out = explain_gateway.route(proxy, push, name)
        # A gateway's route patches match the Gateway server ports behind the listen port.
        ports = {listen: frozenset(servers) for listen, servers in gateway_port_map(proxy, push)}
        out["envoyFilters"] = _patches(
            proxy,
            push,
            ROUTE_KINDS,
            lambda patch: patch.matches_context(context) and name_matches_route(name, patch, context, ports),
        )
        return out
    scope = proxy.sidecar_scope
    port, _ = parse_route_name(name)
    out = {"port": port}
    listener = scope.egress_listener_for_port(port) if scope is not None and port is not None else None
    if proxy.type is not NodeType.SIDECAR:
        out["from"] = "routes of this kind of proxy are not traced (see /debug/config_dump)"
        return out
    if scope is None or listener is None or port is None:
        out["from"] = "no egress listener of the proxy's scope serves this route"
        return out
    services, _, _ = services_on_port(listener.services, port)
    out["scope"] = scope_name(scope)
    out["services"] = [_service_json(s, push) for s in sorted(services.values(), key=lambda s: s.hostname)]
    out["virtualServices"] = [
        {
            "name": f"{vs.config.namespace}/{vs.config.name}",
            "hosts": list(vs.hosts),
            "exportTo": sorted(vs.export_to),
        }
        for vs in listener.virtual_services
        if port == 80 or hosts_for_virtual_service(vs, services)[1]
    ]
    parts = route_cache_parts(scope, name, push.domain_suffix)
    if parts is not None:
        out["destinationRules"] = sorted(
            f"{k.namespace}/{k.name}" for k in parts.dependencies if k.kind is Kind.DESTINATION_RULE
        )
    out["envoyFilters"] = _patches(
        proxy,
        push,
        ROUTE_KINDS,
        lambda patch: patch.matches_context(context) and name_matches_route(name, patch, context),
    )
    return out


def _security(proxy: Proxy, push: PushContext) -> dict[str, Any]:
    """The AuthorizationPolicies (by action) and RequestAuthentications that select the workload, as
    the inbound security filters of a sidecar's inbound chains and of a gateway's listeners take them."""
    policies = authorization_policies(push, proxy)
    return {
        "authorizationPolicies": {
            action: [_ref(c) for c in group]
            for action, group in (
                ("CUSTOM", policies.custom),
                ("DENY", policies.deny),
                ("ALLOW", policies.allow),
                ("AUDIT", policies.audit),
            )
            if group
        },
        "requestAuthentications": [_ref(c) for c in request_authentications(push, proxy)],
    }


def _listener_patches(
    proxy: Proxy, push: PushContext, name: str, inbound: bool, ports: set[int]
) -> list[str]:
    """The listener EnvoyFilter patches that may apply to listener ``name`` listening on ``ports``."""
    context = _context(proxy, inbound)

    def fits(patch: Patch) -> bool:
        if not patch.matches_context(context):
            return False
        if not patch.match.HasField("listener"):
            return True
        wanted = patch.match.listener
        if wanted.name:
            return bool(wanted.name == name)
        return not wanted.port_number or wanted.port_number in ports

    return _patches(proxy, push, LISTENER_KINDS, fits)


def _gateway_listener(proxy: Proxy, push: PushContext, name: str) -> dict[str, Any]:
    out, port, policies = explain_gateway.listener(proxy, push, name)
    if policies:
        out.update(_security(proxy, push))
    out["envoyFilters"] = _listener_patches(proxy, push, name, False, {port} if port is not None else set())
    return out


def _listener(proxy: Proxy, push: PushContext, name: str) -> dict[str, Any]:
    if proxy.type is NodeType.ROUTER:
        return _gateway_listener(proxy, push, name)
    if proxy.type is not NodeType.SIDECAR:
        return {"from": "listeners of this kind of proxy are not traced (see /debug/config_dump)"}
    scope = proxy.sidecar_scope
    out: dict[str, Any] = {}
    if scope is not None:
        out["scope"] = scope_name(scope)
    _, _, port_text = name.rpartition("_")
    if name == "virtualOutbound":
        where = scope_name(scope) if scope is not None and scope.config is not None else "MeshConfig"
        out["from"] = (
            "the catch-all outbound listener: it hands connections to the port listeners; "
            f"the outboundTrafficPolicy of {where} decides where the rest go"
        )
    elif name != "virtualInbound" and not port_text.isdigit():
        out["from"] = "not a sidecar listener explain knows"
    elif name != "virtualInbound":
        port = int(port_text)
        listener = scope.egress_listener_for_port(port) if scope is not None else None
        services = services_on_port(listener.services, port)[0] if listener is not None else {}
        out["services"] = [
            _service_json(s, push) for s in sorted(services.values(), key=lambda s: s.hostname)
        ]
    else:
        out["services"] = [
            {**_service_json(t.service, push), "port": t.port.port, "targetPort": t.target_port}
            for t in proxy.service_targets
        ]
        labels = dict(proxy.labels)
        namespaces = dict.fromkeys((push.mesh.root_namespace, proxy.config_namespace))
        out["peerAuthentications"] = [
            _ref(c)
            for ns in namespaces
            for c in push.configs(Kind.PEER_AUTHENTICATION, ns)
            if not c.spec.HasField("selector") or selector_matches(c.spec.selector.match_labels, labels)
        ]
        out.update(_security(proxy, push))
    if scope is not None and scope.config is not None:
        out["sidecar"] = _ref(scope.config)
    inbound = name == "virtualInbound"
    # A port of the virtual listeners is that of their filter chains: the workload's ports.
    ports = {t.target_port for t in proxy.service_targets} if inbound else set()
    if port_text.isdigit():
        ports.add(int(port_text))
    out["envoyFilters"] = _listener_patches(proxy, push, name, inbound, ports)
    return out


def _endpoints(proxy: Proxy, push: PushContext, index: Any, name: str) -> dict[str, Any]:
    parsed = names.parse_cluster(name)
    scope = proxy.sidecar_scope
    if parsed is None or scope is None:
        return {"from": "not an outbound cluster of the proxy's scope"}
    _, port, subset, host = parsed
    svc = scope.service(host)
    out: dict[str, Any] = {"service": _service_json(svc, push) if svc is not None else None, "port": port}
    if subset:
        rule = scope.destination_rule(host)
        found = rule.subset(subset) if rule is not None else None
        out["subset"] = {"name": subset, "labels": dict(found.labels) if found is not None else None}
    if svc is not None:
        shards = index.shards(svc.hostname, svc.namespace)
        out["sources"] = (
            [
                {"source": str(key), "endpoints": len(endpoints)}
                for key, endpoints in sorted(shards.shards.items())
            ]
            if shards is not None
            else []
        )
    return out


_TYPES = {
    "cds": "cluster",
    "cluster": "cluster",
    "rds": "route",
    "route": "route",
    "lds": "listener",
    "listener": "listener",
    "eds": "endpoints",
    "endpoint": "endpoints",
    "endpoints": "endpoints",
}


class ExplainError(ValueError):
    """A resource reference that names no type explain knows."""


def resource(conn: Connection, push: PushContext, index: Any, reference: str) -> dict[str, Any]:
    """The Istio objects behind ``TYPE/NAME`` (``cds/outbound|9080||reviews...``) of ``conn``'s proxy."""
    short, sep, name = reference.partition("/")
    kind = _TYPES.get(short.lower())
    if not sep or kind is None or not name:
        raise ExplainError(f"resource must be TYPE/NAME with TYPE one of cds, eds, lds, rds: {reference!r}")
    proxy = conn.proxy
    if kind == "cluster":
        found = _cluster(proxy, push, name)
    elif kind == "route":
        found = _route(proxy, push, name)
    elif kind == "listener":
        found = _listener(proxy, push, name)
    else:
        found = _endpoints(proxy, push, index, name)
    return {
        "proxy": proxy.id,
        "resource": {"type": short.lower(), "name": name},
        "modelVersion": push.version,
        **found,
    }
