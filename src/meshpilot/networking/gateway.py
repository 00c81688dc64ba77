"""Listeners and route configurations of a gateway proxy (``router``), from its Gateways' servers.

Plaintext HTTP servers are served: a listener per (bind, port) whose
HttpConnectionManager fetches ``http.<port>[.<bind>]`` over RDS, and that
route configuration holds a virtual host per VirtualService host bound to one
of the port's servers. A Gateway port that a Service selecting the gateway Pod
exposes is listened on at the Service's targetPort, as istiod does (port 80 of
``istio-ingressgateway`` is 8080 in the Pod). Servers of other protocols
(HTTPS, TLS, TCP) are not served yet; they are logged once per snapshot.
"""

from __future__ import annotations

import logging
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.config.route.v3 import route_components_pb2 as rc

from meshpilot.model.gateways import GatewayRef, GatewayServer, served_host
from meshpilot.model.proxy import Proxy
from meshpilot.model.push_context import PushContext
from meshpilot.networking import endpoint as eds
from meshpilot.networking import names
from meshpilot.networking.filters import http_connection_manager
from meshpilot.networking.http_routes import routes_for_virtual_service
from meshpilot.networking.route import hash_lookup, route_header

log = logging.getLogger(__name__)

_ANY_ADDRESS = "0.0.0.0"
BLACKHOLE_VHOST = "blackhole"


def route_name(server: GatewayServer) -> str:
    """istiod's RDS name for a plaintext HTTP server: ``http.<port>``, then ``.<bind>`` when bound."""
    return f"http.{server.port}.{server.bind}" if server.bind else f"http.{server.port}"


def _listen_port(proxy: Proxy, port: int) -> int:
    """The port the gateway Pod listens on for a Gateway port (a Service's targetPort, if one maps it)."""
    for target in proxy.service_targets:
        if target.port.port == port and target.target_port:
            return target.target_port
    return port


def gateway_listeners(proxy: Proxy, push: PushContext) -> list[Any]:
    merged = push.merged_gateway(proxy)
    listeners: dict[str, Any] = {}
    skipped = []
    for server in merged.servers:
        if not server.protocol.is_http:
            skipped.append(server)
            continue
        bind = server.bind or _ANY_ADDRESS
        port = _listen_port(proxy, server.port)
        name = names.listener_name(bind, port)
        if name in listeners:
            continue  # the route configuration holds every server on the port
        hcm = http_connection_manager(
            proxy,
            stat_prefix=names.stat_name(f"outbound_{name}"),
            inbound=False,
            rds_name=route_name(server),
            gateway=True,
        )
        listener = listener_pb2.Listener(
            name=name,
            address=eds.socket_address(bind, port),
            traffic_direction=base_pb2.OUTBOUND,
            filter_chains=[listener_components_pb2.FilterChain(filters=[hcm])],
        )
        listeners[name] = listener
    for server in skipped:
        log.warning(
            "gateway %s: %s server on port %d is not served (only plaintext HTTP servers are)",
            server.gateway_name,
            server.protocol.value,
            server.port,
        )
    return list(listeners.values())


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
    parsed = _parse_route_name(name)
    if parsed is None:
        return out
    port, bind = parsed
    servers = [s for s in push.merged_gateway(proxy).servers_on(port, bind) if s.protocol.is_http]
    if not servers:
        return out
    scope = proxy.sidecar_scope
    assert scope is not None
    vhosts: dict[str, Any] = {}
    for server in servers:
        for vs in push.virtual_services_for_gateway(proxy.config_namespace, server.gateway):
            routes: list[Any] | None = None
            for host in vs.hosts:
                served = served_host(host, vs.config.namespace, server)
                if served is None:
                    continue
                if routes is None:
                    routes = routes_for_virtual_service(
                        proxy,
                        vs.config,
                        port,
                        scope.service,
                        push.mesh,
                        push.domain_suffix,
                        hash_lookup(scope, vs.config.namespace, push.domain_suffix),
                        GatewayRef(server.gateway, push.domain_suffix),
                    )
                vhost_name = f"{served}:{port}"
                vhost = vhosts.get(vhost_name)
                if vhost is None:
                    vhost = rc.VirtualHost(
                        name=vhost_name, domains=[served], include_request_attempt_count=True
                    )
                    if server.https_redirect:
                        vhost.require_tls = rc.VirtualHost.ALL
                    vhosts[vhost_name] = vhost
                # Several VirtualServices for one host: their routes in VirtualService order.
                vhost.routes.extend(routes)
    kept = [v for v in vhosts.values() if v.routes]
    out.virtual_hosts.extend(sorted(kept, key=lambda v: v.name) or [_blackhole(port)])
    return out
