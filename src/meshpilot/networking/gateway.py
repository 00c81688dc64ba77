"""Listeners and route configurations of a gateway proxy (``router``), from its Gateways' servers.

A listener per (bind, port). Plaintext HTTP servers: an HttpConnectionManager
fetching ``http.<port>[.<bind>]`` over RDS, whose route configuration holds a
virtual host per VirtualService host bound to one of the port's servers. TLS
PASSTHROUGH servers: a chain per ``tls`` route match, chosen by SNI. TCP
servers: the first ``tcp`` route that applies. A Gateway port that a Service
selecting the gateway Pod exposes is listened on at the Service's targetPort,
as istiod does (port 80 of ``istio-ingressgateway`` is 8080 in the Pod).
Servers that terminate TLS (SIMPLE, MUTUAL, OPTIONAL_MUTUAL, ISTIO_MUTUAL)
get a chain each, selected by the SNI of their hosts, with the TLS context of
``gateway_tls`` (certificates over SDS): HTTPS servers an HttpConnectionManager
fetching ``https.<port>.<portName>.<gateway>.<namespace>``, TLS servers the
first ``tcp`` route that applies. They share a listener with PASSTHROUGH
servers of the port. AUTO_PASSTHROUGH servers (east-west gateways) get a chain
per SNI-DNAT cluster of the services within their hosts, chosen by the SNI of
mesh mTLS, without any route (``auto_passthrough``). Servers that conflict
with the port's first one or repeat its SNI hosts are logged and counted by
Gateway (``meshpilot_policy_problems_total``); they get no chain, so nothing
they name is served in plaintext.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.config.route.v3 import route_components_pb2 as rc

from meshpilot.model.gateways import GatewayRef, GatewayServer, served_hosts
from meshpilot.model.hosts import is_wildcard
from meshpilot.model.protocol import Protocol
from meshpilot.model.proxy import Proxy
from meshpilot.model.push_context import PushContext, VirtualServiceEntry
from meshpilot.model.telemetry import TelemetryClass
from meshpilot.networking import (
    access_log,
    auto_passthrough,
    extensions,
    inbound_security,
    metadata_exchange,
    names,
    stats_filters,
)
from meshpilot.networking import endpoint as eds
from meshpilot.networking.filters import http_connection_manager
from meshpilot.networking.gateway_tls import TERMINATING, downstream_context, https_route_name, sni_hosts
from meshpilot.networking.listener import tls_inspector
from meshpilot.networking.policy_problems import PROBLEMS
from meshpilot.networking.protobuf import duration
from meshpilot.networking.route import route_header, virtual_service_routes
from meshpilot.networking.tcp_routes import RouteContext, route_filters, static_match
from meshpilot.networking.tls import tls_transport_socket
from meshpilot.networking.tracing import hcm_tracing

log = logging.getLogger(__name__)

_ANY_ADDRESS = "0.0.0.0"
BLACKHOLE_VHOST = "blackhole"
#: istiod's PILOT_GATEWAY_TRANSPORT_SOCKET_CONNECT_TIMEOUT default.
_HANDSHAKE_TIMEOUT_SECONDS = 15


def route_name(listen_port: int, bind: str) -> str:
    """istiod's RDS name for the plaintext HTTP servers of a listener: ``http.<port>``, then ``.<bind>``
    when bound. The port is the one the gateway Pod listens on (the Service's targetPort), not the
    Gateway's, as istiod names it."""
    return f"http.{listen_port}.{bind}" if bind else f"http.{listen_port}"


def service_port_map(proxy: Proxy) -> tuple[tuple[int, int | None], ...]:
    """The (Service port, targetPort) pairs of the Services selecting a gateway Pod: what maps its
    Gateway ports to the ports it listens on, so part of every cache key of its listeners and routes."""
    return tuple(sorted((t.port.port, t.target_port) for t in proxy.service_targets))


def _listen_port(proxy: Proxy, port: int) -> int:
    """The port the gateway Pod listens on for a Gateway port (a Service's targetPort, if one maps it)."""
    for target in proxy.service_targets:
        if target.port.port == port and target.target_port:
            return target.target_port
    return port


def _kind(server: GatewayServer) -> str:
    """How a server is served: "http"; "https" or "tls" (TLS terminated here, then HTTP or the ``tcp``
    routes); "passthrough" (TLS by SNI, not terminated); "auto" (AUTO_PASSTHROUGH: mesh mTLS by SNI to
    SNI-DNAT clusters); "tcp"; or "" (not yet)."""
    if server.protocol.is_http:
        return "http"
    if server.tls_mode == auto_passthrough.MODE:
        # Any non-HTTP protocol, as istiod: the SNI, not the port's protocol, says where to go.
        return "auto"
    if server.tls_mode in TERMINATING:
        if server.protocol is Protocol.HTTPS:
            return "https"
        if server.protocol is Protocol.TLS:
            return "tls"
        return ""
    if server.protocol.is_tls and server.tls_mode == "PASSTHROUGH":
        return "passthrough"
    if server.protocol.is_tcp and not server.protocol.is_tls:
        return "tcp"
    return ""


#: Kinds of server that share a listener: every TLS server of a port is told apart by SNI.
_FAMILY = {
    "http": "http",
    "https": "tls",
    "tls": "tls",
    "passthrough": "tls",
    "auto": "tls",
    "tcp": "tcp",
    "": "",
}


def _not_served(server: GatewayServer, why: str) -> None:
    PROBLEMS.record(
        "Gateway",
        server.gateway_name,
        f"{server.protocol.value} server on port {server.port} (tls mode {server.tls_mode or 'none'}) "
        f"is not served: {why}",
    )


def gateway_listeners(proxy: Proxy, push: PushContext) -> list[Any]:
    """A listener per bind and port of the servers that can be served; servers that cannot are logged
    and counted."""
    by_listener: dict[tuple[str, int], list[tuple[str, GatewayServer]]] = {}
    for server in push.merged_gateway(proxy).servers:
        key = (server.bind or _ANY_ADDRESS, _listen_port(proxy, server.port))
        by_listener.setdefault(key, []).append((_kind(server), server))
    out = []
    # The AuthorizationPolicies and RequestAuthentications selecting the gateway's workload, as on a
    # sidecar's inbound chains: istiod applies them to the gateway's listeners the same way.
    security = inbound_security.filters(proxy, push)
    for (bind, port), kinds in by_listener.items():
        # The first server that can be served decides the listener; the others on it are logged.
        family = next((_FAMILY[k] for k, _ in kinds if k), "")
        for other, server in kinds:
            if not other:
                _not_served(server, "not supported yet")
            elif _FAMILY[other] != family:
                _not_served(server, f"port {port} already serves {family} servers")
        same = [(k, server) for k, server in kinds if k and _FAMILY[k] == family]
        kind = family
        listener = listener_pb2.Listener(
            name=names.listener_name(bind, port),
            address=eds.socket_address(bind, port),
            traffic_direction=base_pb2.OUTBOUND,
        )
        # As istiod's (MAX_CONNECTIONS_PER_SOCKET_EVENT_LOOP, 1): accept one connection per wakeup, so
        # a burst of clients is spread over Envoy's worker threads, not taken by the first to wake.
        listener.max_connections_to_accept_per_socket_event.value = 1
        if kind == "http":
            # One route configuration holds every server of the port.
            hcm = http_connection_manager(
                proxy,
                stat_prefix=names.stat_name(f"outbound_{listener.name}"),
                inbound=False,
                rds_name=route_name(port, same[0][1].bind),
                gateway=True,
                security=security.http,
                stats=stats_filters.http(push, proxy, TelemetryClass.CLIENT),
                access_log=access_log.filter_loggers(push, proxy, TelemetryClass.CLIENT, http=True),
                tracing=hcm_tracing(push, proxy, TelemetryClass.CLIENT),
            )
            listener.filter_chains.append(listener_components_pb2.FilterChain(filters=[hcm]))
        elif kind == "tls":
            listener.filter_chains.extend(_tls_chains(proxy, push, listener.name, same, security))
            listener.listener_filters.append(tls_inspector())
        elif kind == "tcp":
            listener.filter_chains.extend(_tcp_chains(proxy, push, [s for _, s in same]))
            if security.tcp:
                for chain in listener.filter_chains:
                    chain.filters[0:0] = list(security.tcp)
        tcp_stats = stats_filters.tcp(push, proxy, TelemetryClass.CLIENT)
        for chain in listener.filter_chains:
            stats_filters.add_to_chain(chain, tcp_stats)
            # As istiod's: a client gets 15 s to finish its transport (TLS) handshake, so slow
            # handshakes cannot hold a gateway's memory.
            chain.transport_socket_connect_timeout.CopyFrom(duration(_HANDSHAKE_TIMEOUT_SECONDS))
        # A listener without chains would be rejected by Envoy: a port nothing routes is not listened on.
        if listener.filter_chains:
            listener.access_log.extend(access_log.listener_loggers(push, proxy, TelemetryClass.CLIENT))
            out.append(listener)
    return out


def _tls_chains(
    proxy: Proxy,
    push: PushContext,
    listener_name: str,
    servers: list[tuple[str, GatewayServer]],
    security: inbound_security.InboundSecurityFilters,
) -> list[Any]:
    """A chain per server, in order: terminating ones chosen by their SNI hosts (a server repeating
    hosts already taken on the port is skipped, as istiod skips it), passthrough ones per route."""
    out: list[Any] = []
    taken: set[str] = set()
    for kind, server in servers:
        if kind == "passthrough":
            chains = _passthrough_chains(proxy, push, [server])
            for chain in chains:
                if security.tcp:
                    filters = [*security.tcp, *chain.filters]
                    del chain.filters[:]
                    chain.filters.extend(filters)
            out.extend(chains)
            continue
        sni = sni_hosts(server)
        hosts = set(sni) or {"*"}
        if hosts & taken:
            _not_served(server, f"duplicate host names {sorted(hosts & taken)} on the port")
            continue
        taken |= hosts
        if kind == "auto":
            # Without the gateway's authorization filters, as istiod: the destination's sidecar,
            # which terminates this mTLS, enforces its own policies.
            loggers = access_log.filter_loggers(push, proxy, TelemetryClass.CLIENT, http=False)
            out.extend(auto_passthrough.filter_chains(proxy, server, loggers))
            continue
        if kind == "https":
            hcm = http_connection_manager(
                proxy,
                stat_prefix=server.name or names.stat_name(f"outbound_{listener_name}"),
                inbound=False,
                rds_name=https_route_name(server),
                gateway=True,
                security=security.http,
                stats=stats_filters.http(push, proxy, TelemetryClass.CLIENT),
                access_log=access_log.filter_loggers(push, proxy, TelemetryClass.CLIENT, http=True),
                tracing=hcm_tracing(push, proxy, TelemetryClass.CLIENT),
            )
            filters = [hcm]
        else:
            routes = _tcp_chains(proxy, push, [server])
            if not routes:
                log.warning("gateway %s:%d listener missed network filter", server.gateway_name, server.port)
                continue
            # An ISTIO_MUTUAL server offers the exchange ALPN (gateway_tls): the filter reads it first.
            exchange = server.tls_mode == "ISTIO_MUTUAL" and extensions.has_tcp_metadata_exchange(proxy)
            filters = [
                *([metadata_exchange.listener_filter()] if exchange else []),
                *security.tcp,
                *routes[0].filters,
            ]
        chain = listener_components_pb2.FilterChain(filters=filters)
        if sni:
            chain.filter_chain_match.server_names.extend(sni)
        context = downstream_context(proxy, server, push.mesh, tcp=kind == "tls")
        chain.transport_socket.CopyFrom(tls_transport_socket(context))
        out.append(chain)
    return out


def _bound(push: PushContext, proxy: Proxy, server: GatewayServer) -> list[VirtualServiceEntry]:
    """The VirtualServices bound to the server's Gateway with a host the server serves."""
    return [
        vs
        for vs in push.virtual_services_for_gateway(proxy.config_namespace, server.gateway)
        if any(served_hosts(h, vs.config.namespace, server) for h in vs.hosts)
    ]


def _bound_routes(
    proxy: Proxy, push: PushContext, servers: list[GatewayServer], section: str
) -> Iterator[tuple[GatewayServer, RouteContext, GatewayRef, VirtualServiceEntry, Any]]:
    """The ``tls`` or ``tcp`` routes with destinations of the VirtualServices bound to each server."""
    for server in servers:
        ctx = RouteContext(proxy, push, server.port)
        gateway = GatewayRef(server.gateway, push.domain_suffix)
        for vs in _bound(push, proxy, server):
            for route in getattr(vs.config.spec, section):
                if route.route:
                    yield server, ctx, gateway, vs, route


def _passthrough_chains(proxy: Proxy, push: PushContext, servers: list[GatewayServer]) -> list[Any]:
    """A chain per ``tls`` route match, selected by the SNI the server's hosts allow."""
    out = []
    seen: set[tuple[str, ...]] = set()
    for server, ctx, gateway, vs, route in _bound_routes(proxy, push, servers, "tls"):
        for match in route.match:
            if not static_match(match, proxy, server.port, vs.config.namespace, gateway):
                continue
            sni = tuple(
                sorted({h for n in match.sni_hosts for h in served_hosts(n, vs.config.namespace, server)})
            )
            if not sni or sni in seen:
                continue
            seen.add(sni)
            out.append(
                listener_components_pb2.FilterChain(
                    filters=route_filters(ctx, list(route.route), vs)(),
                    filter_chain_match=listener_components_pb2.FilterChainMatch(server_names=sni),
                )
            )
    return out


def _tcp_chains(proxy: Proxy, push: PushContext, servers: list[GatewayServer]) -> list[Any]:
    """The first ``tcp`` route that applies: a TCP port has one chain, as in istiod."""
    for server, ctx, gateway, vs, route in _bound_routes(proxy, push, servers, "tcp"):
        namespace = vs.config.namespace
        if not route.match or any(
            static_match(m, proxy, server.port, namespace, gateway) for m in route.match
        ):
            return [listener_components_pb2.FilterChain(filters=route_filters(ctx, list(route.route), vs)())]
    return []


def _parse_route_name(name: str) -> tuple[int, str] | None:
    prefix, _, rest = name.partition(".")
    port, _, bind = rest.partition(".")
    if prefix != "http" or not port.isdigit():
        return None
    return int(port), bind


def _blackhole(port: int) -> Any:
    route = rc.Route(name="default", match=rc.RouteMatch(prefix="/"))
    route.direct_response.status = 404
    return rc.VirtualHost(name=f"{BLACKHOLE_VHOST}:{port}", domains=["*"], routes=[route])


def gateway_route_configuration(proxy: Proxy, push: PushContext, name: str) -> Any:
    """The route configuration ``name`` of a gateway: empty if no server of the proxy's Gateways has it."""
    out = route_header(name)
    merged = push.merged_gateway(proxy).servers
    if name.startswith("https."):
        # One HTTPS server terminating TLS (a route configuration each, as its chain is its own).
        servers = [s for s in merged if _kind(s) == "https" and https_route_name(s) == name]
    else:
        parsed = _parse_route_name(name)
        if parsed is None:
            return out
        listen_port, bind = parsed
        servers = [
            s
            for s in merged
            if s.bind == bind and s.protocol.is_http and _listen_port(proxy, s.port) == listen_port
        ]
    if not servers:
        return out
    vhosts: dict[str, Any] = {}
    # Which route lists each host's virtual host was made of: hosts made of the very same lists (the
    # hosts of one VirtualService) share one virtual host, as istiod's route collapse does.
    sources: dict[str, list[int]] = {}
    for server in servers:
        port = server.port
        for vs in push.virtual_services_for_gateway(proxy.config_namespace, server.gateway):
            namespace = vs.config.namespace
            hosts = dict.fromkeys(h for vs_host in vs.hosts for h in served_hosts(vs_host, namespace, server))
            if not hosts:
                continue
            routes = virtual_service_routes(
                proxy, push, vs.config, port, GatewayRef(server.gateway, push.domain_suffix)
            )
            for host in hosts:
                vhost = vhosts.get(host)
                if vhost is None:
                    # The host alone: the route configuration ignores a port in the Host header.
                    vhost = vhosts[host] = rc.VirtualHost(
                        name=f"{host}:{port}", domains=[host], include_request_attempt_count=True
                    )
                # Several VirtualServices (or servers) for one host add their routes in order, as in istiod.
                vhost.routes.extend(routes)
                sources.setdefault(host, []).append(id(routes))
                if server.https_redirect:
                    vhost.require_tls = rc.VirtualHost.ALL
    kept = _collapse({h: v for h, v in vhosts.items() if v.routes}, sources)
    out.virtual_hosts.extend(sorted(kept, key=lambda v: v.name) or [_blackhole(servers[0].port)])
    return out


def _specificity(host: str) -> tuple[bool, int, str]:
    """istiod's host order: exact hosts before wildcards, longer before shorter, then alphabetical."""
    return is_wildcard(host), -len(host), host


def _collapse(vhosts: dict[str, Any], sources: dict[str, list[int]]) -> list[Any]:
    """One virtual host for the hosts whose routes are the same lists, named after the most specific
    host and listing every host's domains (istiod's PILOT_ENABLE_ROUTE_COLLAPSE_OPTIMIZATION, on by
    default): a VirtualService with many hosts is sent once, not once per host."""
    primary: dict[tuple[tuple[int, ...], int], Any] = {}
    for host in sorted(vhosts, key=_specificity):
        vhost = vhosts[host]
        key = (tuple(sources[host]), vhost.require_tls)
        if key in primary:
            primary[key].domains.extend(vhost.domains)
        else:
            primary[key] = vhost
    return list(primary.values())
