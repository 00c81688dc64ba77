"""Push explanation for gateways (``router`` proxies): which Gateways make one, why a change concerned
it, and which objects made its listeners, routes and clusters.

A gateway's config comes from the Gateways whose selector matches its labels, in any namespace
(istiod's default, ``PILOT_SCOPE_GATEWAY_TO_NAMESPACE`` off), merged (``PushContext.merged_gateway``);
the VirtualServices bound to them that its namespace sees (``PushContext.virtual_services_for_gateway``)
and the hosts each serves on each server (``gateways.served_hosts``); the destinations of those
VirtualServices, with their DestinationRules from the proxy's (default) scope; and the Secrets its
servers name by ``credentialName``. A listener or route is found by giving each server the name the
generator gives it (``gateway.route_name``, ``gateway_tls.https_route_name``, ``names.listener_name``
on the port the Pod listens on, ``envoy_filters.gateway_port_map``), not by reading the name.

``push.explain`` calls this for routers and adds what sidecars and gateways share (the scope's words,
policies, EnvoyFilters).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from meshpilot.model.config import Config, ConfigKey
from meshpilot.model.credentials import (
    KUBERNETES_SECRET_URI,
    parse_resource_name,
    related_keys,
    to_resource_name,
)
from meshpilot.model.egress_imports import virtual_service_destinations
from meshpilot.model.gateways import GatewayServer, binds_gateway, served_hosts
from meshpilot.model.kind import Kind
from meshpilot.model.protocol import Protocol
from meshpilot.model.proxy import Proxy
from meshpilot.model.push_context import PushContext, VirtualServiceEntry
from meshpilot.networking import auto_passthrough, names
from meshpilot.networking.gateway import route_name
from meshpilot.networking.gateway_tls import TERMINATING, https_route_name
from meshpilot.networking.listener import WILDCARD
from meshpilot.xds.generators.envoy_filters import gateway_port_map

#: How a router is selected, said once (istiod's default; meshpilot has no other).
SELECTION = "a Gateway of any namespace selects gateways by labels (PILOT_SCOPE_GATEWAY_TO_NAMESPACE off)"


def config_ref(config: Config) -> str:
    """How explain names an Istio object: ``Kind namespace/name``."""
    return f"{config.meta.kind.value} {config.namespace}/{config.name}"


def _key_ref(key: ConfigKey) -> str:
    return f"{key.kind.value} {key.namespace}/{key.name}"


def _labels(selector: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(selector.items())) or "(none: every gateway)"


def listen_ports(proxy: Proxy, push: PushContext) -> dict[int, int]:
    """Gateway server port -> the port the gateway Pod listens on for it (a Service's targetPort)."""
    return {server: listen for listen, servers in gateway_port_map(proxy, push) for server in servers}


def _servers(proxy: Proxy, push: PushContext) -> tuple[GatewayServer, ...]:
    return push.merged_gateway(proxy).servers


def _route_of(server: GatewayServer, listen: int) -> str:
    """The RDS name of a server's HTTP routes; "" when its routes are in the listener (TLS, TCP)."""
    if server.protocol.is_http:
        return route_name(listen, server.bind)
    if server.protocol is Protocol.HTTPS and server.tls_mode in TERMINATING:
        return https_route_name(server)
    return ""


def _section(server: GatewayServer, listen: int) -> str:
    """Which routes of a bound VirtualService the server takes: ``http`` (its route configuration),
    ``tls`` (PASSTHROUGH: a chain per SNI), ``tcp`` (TCP, or TLS terminated here), or none
    (AUTO_PASSTHROUGH goes by SNI to the services, without routes)."""
    if _route_of(server, listen):
        return "http"
    if server.tls_mode == auto_passthrough.MODE:
        return ""
    return "tls" if server.tls_mode == "PASSTHROUGH" else "tcp"


def _serves(server: GatewayServer, listen: int, vs: VirtualServiceEntry, hosts: list[str]) -> bool:
    """Whether a bound VirtualService with ``hosts`` on the server adds routes to it."""
    section = _section(server, listen)
    return bool(hosts and section and getattr(vs.config.spec, section))


def _listener_of(server: GatewayServer, listen: int) -> str:
    return names.listener_name(server.bind or WILDCARD, listen)


def _where(server: GatewayServer, listen: int) -> str:
    route = _route_of(server, listen)
    return f"route {route}" if route else f"listener {_listener_of(server, listen)}"


def credential_names(server: GatewayServer) -> list[str]:
    """The ``credentialName(s)`` (and ``caCertCredentialName``) of a server that terminates TLS."""
    tls = server.tls
    if tls is None or server.tls_mode not in TERMINATING:
        return []
    found = list(tls.credential_names) or ([tls.credential_name] if tls.credential_name else [])
    if tls.ca_cert_credential_name:
        found.append(tls.ca_cert_credential_name)
    return found


def bindings(
    proxy: Proxy, push: PushContext
) -> Iterator[tuple[GatewayServer, VirtualServiceEntry, list[str]]]:
    """(server, VirtualService bound to its Gateway and visible to the proxy's namespace, the hosts
    it serves there; empty when the server admits none of them)."""
    for server in _servers(proxy, push):
        for vs in push.virtual_services_for_gateway(proxy.config_namespace, server.gateway):
            yield server, vs, _served(vs, server)


def _served(vs: VirtualServiceEntry, server: GatewayServer) -> list[str]:
    namespace = vs.config.namespace
    return list(dict.fromkeys(h for host in vs.hosts for h in served_hosts(host, namespace, server)))


def selecting_gateways(proxy: Proxy, push: PushContext) -> list[dict[str, Any]]:
    """The Gateways whose servers the router takes, with their selectors and ports."""
    by_key = {c.key: c for c in push.configs(Kind.GATEWAY)}
    ports: dict[ConfigKey, list[int]] = {}
    for server in _servers(proxy, push):
        ports.setdefault(server.gateway, [])
        if server.port not in ports[server.gateway]:
            ports[server.gateway].append(server.port)
    return [
        {
            "name": f"{key.namespace}/{key.name}",
            "selector": dict(by_key[key].spec.selector) if key in by_key else {},
            "ports": found,
        }
        for key, found in ports.items()
    ]


def server_json(server: GatewayServer, listen: int, push: PushContext, proxy: Proxy) -> dict[str, Any]:
    out: dict[str, Any] = {
        "gateway": server.gateway_name,
        "port": server.port,
        "listenPort": listen,
        "protocol": server.protocol.value,
        "hosts": [f"{h.namespace}/{h.host}" for h in server.hosts],
    }
    if server.name:
        out["name"] = server.name
    if server.bind:
        out["bind"] = server.bind
    if server.tls_mode:
        out["tlsMode"] = server.tls_mode
    credentials = credential_names(server)
    if credentials:
        out["credentialNames"] = credentials
    route = _route_of(server, listen)
    if route:
        out["route"] = route
    out["virtualServices"] = [
        f"{vs.config.namespace}/{vs.config.name}"
        for vs in push.virtual_services_for_gateway(proxy.config_namespace, server.gateway)
        if _serves(server, listen, vs, _served(vs, server))
    ]
    return out


# -- why a change concerned a gateway ------------------------------------------------------------


def why(proxy: Proxy, key: ConfigKey, push: PushContext) -> str | None:
    """Words for how ``key`` reaches the router's Gateways; None when nothing gateway-specific does
    (the scope's words then say it)."""
    if key.kind is Kind.GATEWAY:
        return _why_gateway(proxy, key, push)
    if key.kind is Kind.VIRTUAL_SERVICE:
        return _why_virtual_service(proxy, key, push)
    if key.kind in (Kind.DESTINATION_RULE, Kind.SERVICE_ENTRY):
        return _why_destination(proxy, key, push)
    if key.kind is Kind.SECRET:
        return _why_secret(proxy, key, push)
    return None


def _why_gateway(proxy: Proxy, key: ConfigKey, push: PushContext) -> str:
    config = next((c for c in push.configs(Kind.GATEWAY, key.namespace) if c.name == key.name), None)
    every = "a gateway takes every Gateway change, since any may start or stop selecting it"
    if config is None:
        return f"{_key_ref(key)} is gone (or not valid); {every}"
    selector = _labels(dict(config.spec.selector))
    listen = listen_ports(proxy, push)
    mine = [s for s in _servers(proxy, push) if s.gateway == key]
    if not mine:
        return f"{_key_ref(key)} does not select it (selector {selector}); {every}"
    made = ", ".join(dict.fromkeys(_where(s, listen.get(s.port, s.port)) for s in mine))
    return f"{_key_ref(key)} selects it (selector {selector}; {SELECTION}) and makes its {made}"


def _why_virtual_service(proxy: Proxy, key: ConfigKey, push: PushContext) -> str:
    listen = listen_ports(proxy, push)
    parts: dict[str, None] = {}
    bound: VirtualServiceEntry | None = None
    for server, vs, hosts in bindings(proxy, push):
        if vs.config.key != key and key not in vs.delegates:
            continue
        bound = vs
        via = "" if vs.config.key == key else f" (as a delegate of {config_ref(vs.config)})"
        gateway = f"Gateway {server.gateway_name}{via}"
        port = listen.get(server.port, server.port)
        if _serves(server, port, vs, hosts):
            where = _where(server, port)
            parts[f"serves {', '.join(hosts)} on port {server.port} of {gateway} ({where})"] = None
        elif hosts:
            section = _section(server, port) or "any"
            parts[f"is bound to {gateway}, but has no {section} routes for its port {server.port} server"] = (
                None
            )
        else:
            parts[f"is bound to {gateway}, whose port {server.port} server admits none of its hosts"] = None
    every = "a gateway takes every VirtualService change, since any may bind to it"
    if bound is not None:
        listed = ", ".join(sorted(bound.gateways))
        return f"{_key_ref(key)} (gateways: {listed}) " + "; ".join(parts)
    entry = next((vs for vs in push.virtual_services if vs.config.key == key), None)
    if entry is None:
        # Delegates are merged into the VirtualServices that name them: only those are listed.
        exists = any(c.name == key.name for c in push.configs(Kind.VIRTUAL_SERVICE, key.namespace))
        if exists:
            return f"{_key_ref(key)} is a delegate that no VirtualService bound to its Gateways uses; {every}"
        return f"{_key_ref(key)} is gone (or not valid); {every}"
    gateways = dict.fromkeys(s.gateway for s in _servers(proxy, push))
    named = [g for g in gateways if binds_gateway(key.namespace, entry.gateways, g, push.domain_suffix)]
    if named:
        exported = ", ".join(sorted(entry.export_to)) or "(mesh default)"
        return (
            f"{_key_ref(key)} binds Gateway {named[0].namespace}/{named[0].name} but is not exported to "
            f"the gateway's namespace {proxy.config_namespace} (exportTo {exported}); {every}"
        )
    return f"{_key_ref(key)} binds none of the Gateways that select it; {every}"


def _why_destination(proxy: Proxy, key: ConfigKey, push: PushContext) -> str | None:
    """A service or DestinationRule reached as a destination of a bound VirtualService."""
    scope = proxy.sidecar_scope
    if scope is None:
        return None
    listen = listen_ports(proxy, push)
    for server, vs, hosts in bindings(proxy, push):
        if not _serves(server, listen.get(server.port, server.port), vs, hosts):
            continue
        for host in virtual_service_destinations(vs.config, proxy.config_namespace, push.domain_suffix):
            if key.kind is Kind.SERVICE_ENTRY:
                svc = scope.service(host)
                found = svc is not None and (svc.hostname, svc.namespace) == (key.name, key.namespace)
                what = f"{host} ({key.namespace}) is"
            else:
                rule = scope.destination_rule(host)
                found = rule is not None and any(c.key == key for c in rule.configs)
                what = f"{_key_ref(key)} applies to {host},"
            if found:
                return (
                    f"{what} a destination of {config_ref(vs.config)}, bound to Gateway {server.gateway_name}"
                )
    return None


def _why_secret(proxy: Proxy, key: ConfigKey, push: PushContext) -> str | None:
    wanted = set(related_keys(key))
    for server in _servers(proxy, push):
        for name in credential_names(server):
            resource = to_resource_name(name)
            if not resource.startswith(KUBERNETES_SECRET_URI):
                continue
            if parse_resource_name(resource, proxy.config_namespace).key in wanted:
                return (
                    f"{_key_ref(key)} is credentialName {name} of the {server.tls_mode} server on port "
                    f"{server.port} of Gateway {server.gateway_name} (secrets are read in the gateway's "
                    f"namespace {proxy.config_namespace} unless named as namespace/name)"
                )
    return None


# -- which objects made a gateway's resource -----------------------------------------------------


def route(proxy: Proxy, push: PushContext, name: str) -> dict[str, Any]:
    """The Gateway servers behind route configuration ``name`` and the VirtualServices it holds."""
    listen = listen_ports(proxy, push)
    servers = [s for s in _servers(proxy, push) if _route_of(s, listen.get(s.port, s.port)) == name]
    if not servers:
        return {"from": "no server of the Gateways selecting this gateway has this route"}
    port = listen.get(servers[0].port, servers[0].port)
    out: dict[str, Any] = {
        "listenPort": port,
        "servers": [server_json(s, port, push, proxy) for s in servers],
    }
    by_vs: dict[ConfigKey, dict[str, Any]] = {}
    for server, vs, hosts in bindings(proxy, push):
        if server not in servers or not _serves(server, port, vs, hosts):
            continue
        entry = by_vs.setdefault(
            vs.config.key,
            {
                "name": f"{vs.config.namespace}/{vs.config.name}",
                "gateways": [],
                "hosts": [],
                "exportTo": sorted(vs.export_to),
            },
        )
        if vs.delegates:
            entry["delegates"] = sorted(f"{k.namespace}/{k.name}" for k in vs.delegates)
        for field, value in (("gateways", server.gateway_name), *(("hosts", h) for h in hosts)):
            if value not in entry[field]:
                entry[field].append(value)
    out["virtualServices"] = list(by_vs.values())
    if not by_vs:
        out["from"] = "no VirtualService bound to these servers serves their hosts: every request gets 404"
    return out


def listener(proxy: Proxy, push: PushContext, name: str) -> tuple[dict[str, Any], int | None, bool]:
    """The Gateway servers behind listener ``name``, the port it listens on (None: no server), and
    whether the workload's policies apply to it (to every chain but AUTO_PASSTHROUGH's, whose
    destination's sidecar enforces its own)."""
    listen = listen_ports(proxy, push)
    servers = [s for s in _servers(proxy, push) if _listener_of(s, listen.get(s.port, s.port)) == name]
    if not servers:
        return {"from": "no server of the Gateways selecting this gateway listens here"}, None, False
    port = listen.get(servers[0].port, servers[0].port)
    out = {"listenPort": port, "servers": [server_json(s, port, push, proxy) for s in servers]}
    return out, port, any(s.tls_mode != auto_passthrough.MODE for s in servers)


def routed_by(proxy: Proxy, push: PushContext, host: str, port: int) -> list[str]:
    """The bound VirtualServices that send traffic to ``host`` on ``port``, with their Gateways."""
    out: dict[str, None] = {}
    listen = listen_ports(proxy, push)
    for server, vs, hosts in bindings(proxy, push):
        if not _serves(server, listen.get(server.port, server.port), vs, hosts):
            continue
        ports = virtual_service_destinations(vs.config, proxy.config_namespace, push.domain_suffix).get(host)
        # A destination without a port goes to the service's only port; any port may be it.
        if ports is not None and (0 in ports or port in ports):
            out[f"{config_ref(vs.config)} (Gateway {server.gateway_name})"] = None
    return list(out)
