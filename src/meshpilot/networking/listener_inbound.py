"""Inbound listeners of a sidecar: virtualInbound (captured traffic) and Sidecar ingress listeners.

PeerAuthentication is not applied yet, so every port is PERMISSIVE, as
istiod treats ports without a policy: mutual TLS from mesh peers and
plaintext from anyone are both accepted.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from envoy.config.core.v3 import address_pb2, base_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.config.route.v3 import route_components_pb2, route_pb2
from envoy.extensions.filters.listener.original_dst.v3 import original_dst_pb2
from envoy.type.v3 import range_pb2

from meshpilot.model.protocol import Protocol
from meshpilot.model.proxy import InterceptionMode, Proxy
from meshpilot.model.push_context import PushContext
from meshpilot.model.sidecar_scope import CAPTURE_IPTABLES, CAPTURE_NONE
from meshpilot.networking import extensions, names
from meshpilot.networking.cluster import config_path
from meshpilot.networking.endpoint import socket_address
from meshpilot.networking.filters import http_connection_manager, tcp_proxy
from meshpilot.networking.listener import HTTP_ALPNS, WILDCARD, http_inspector, tls_inspector
from meshpilot.networking.protobuf import boolean, duration, pack
from meshpilot.networking.tls import istio_mutual_downstream, tls_transport_socket

ISTIO_HTTP_ALPNS = ("istio-http/1.0", "istio-http/1.1", "istio-h2")
ISTIO_TCP_ALPNS = ("istio-peer-exchange", "istio")
ALL_ISTIO_ALPNS = ("istio", "istio-peer-exchange", *ISTIO_HTTP_ALPNS)
#: The bootstrap's health and Prometheus listeners, which a wildcard-bound port would clash with.
_STATIC_LISTENER_PORTS = frozenset({15021, 15090})


@dataclass(frozen=True, slots=True)
class InboundPort:
    """One port the workload serves, and where its traffic goes."""

    port: int
    protocol: Protocol
    cluster: str
    #: Names the service for the route decorator: ``host:servicePort``.
    hostname: str
    service_port: int
    #: Chain name and stat prefix base, ``0.0.0.0_9080``.
    chain_name: str
    #: The Sidecar a port of its ``ingress`` came from, as istiod records it on the chains
    #: (``istio.config`` metadata); empty for a Service's port.
    config: str = ""


def _downstream_tls(proxy: Proxy, push: PushContext, *, http: bool) -> Any:
    alpn = ["h2", "http/1.1"] if http else extensions.mtls_server_tcp_alpn(proxy)
    domains = [push.mesh.trust_domain, *push.mesh.trust_domain_aliases]
    return tls_transport_socket(istio_mutual_downstream(dict.fromkeys(domains), alpn))


def _match(port: int | None, transport: str, alpns: tuple[str, ...] = ()) -> Any:
    match = listener_components_pb2.FilterChainMatch(
        transport_protocol=transport, application_protocols=alpns
    )
    if port is not None:
        match.destination_port.value = port
    return match


def _inbound_route(target: InboundPort) -> Any:
    route = route_components_pb2.Route(
        name="default",
        match=route_components_pb2.RouteMatch(prefix="/"),
        decorator=route_components_pb2.Decorator(operation=f"{target.hostname}:{target.service_port}/*"),
    )
    action = route.route
    action.cluster = target.cluster
    action.timeout.CopyFrom(duration(0))
    action.max_stream_duration.max_stream_duration.CopyFrom(duration(0))
    action.max_stream_duration.grpc_timeout_header_max.CopyFrom(duration(0))
    if target.protocol not in (Protocol.GRPC, Protocol.GRPC_WEB):
        action.retry_policy.retry_on = "reset-before-request"
        action.retry_policy.num_retries.value = 2
    vhost = route_components_pb2.VirtualHost(
        name=f"inbound|http|{target.service_port}", domains=["*"], routes=[route]
    )
    return route_pb2.RouteConfiguration(
        name=target.cluster, virtual_hosts=[vhost], validate_clusters=boolean(False)
    )


def _hcm_filters(proxy: Proxy, target: InboundPort, stat_prefix: str) -> list[Any]:
    return [
        http_connection_manager(
            proxy,
            stat_prefix=stat_prefix,
            inbound=True,
            route_config=_inbound_route(target),
            http2=target.protocol.is_http2,
        )
    ]


def _tcp_filters(target: InboundPort) -> list[Any]:
    return [tcp_proxy(target.cluster)]


def permissive_chains(
    proxy: Proxy, push: PushContext, target: InboundPort, *, port: int | None, name: str, http_name: str = ""
) -> list[Any]:
    """The PERMISSIVE chains for one port: mTLS and plaintext, HTTP and TCP as the protocol allows."""
    stat_prefix = (
        names.stat_name(f"inbound_{target.chain_name}")
        if port is not None
        else names.stat_name(names.INBOUND_PASSTHROUGH_CLUSTER)
    )
    http_name = http_name or name
    chains = []
    protocol = target.protocol
    is_http = protocol.is_http
    is_tcp = protocol.is_tcp
    if is_http:
        chains.append(
            (
                http_name,
                _match(port, "tls", ALL_ISTIO_ALPNS),
                _downstream_tls(proxy, push, http=True),
                _hcm_filters(proxy, target, stat_prefix),
            )
        )
        chains.append((http_name, _match(port, "raw_buffer"), None, _hcm_filters(proxy, target, stat_prefix)))
    elif is_tcp:
        chains.append(
            (
                name,
                _match(port, "tls", ALL_ISTIO_ALPNS),
                _downstream_tls(proxy, push, http=False),
                _tcp_filters(target),
            )
        )
        chains.append((name, _match(port, "tls"), None, _tcp_filters(target)))
        chains.append((name, _match(port, "raw_buffer"), None, _tcp_filters(target)))
    else:
        chains.append(
            (
                http_name,
                _match(port, "tls", ISTIO_HTTP_ALPNS),
                _downstream_tls(proxy, push, http=True),
                _hcm_filters(proxy, target, stat_prefix),
            )
        )
        chains.append(
            (
                http_name,
                _match(port, "raw_buffer", HTTP_ALPNS),
                None,
                _hcm_filters(proxy, target, stat_prefix),
            )
        )
        chains.append(
            (
                name,
                _match(port, "tls", ISTIO_TCP_ALPNS),
                _downstream_tls(proxy, push, http=False),
                _tcp_filters(target),
            )
        )
        chains.append((name, _match(port, "raw_buffer"), None, _tcp_filters(target)))
        chains.append((name, _match(port, "tls"), None, _tcp_filters(target)))
    out = []
    for chain_name, match, socket, filters in chains:
        chain = listener_components_pb2.FilterChain(
            name=chain_name, filter_chain_match=match, filters=filters
        )
        if socket is not None:
            chain.transport_socket.CopyFrom(socket)
        if target.config:
            chain.metadata.filter_metadata["istio"].update({"config": target.config})
        out.append(chain)
    return out


def _global_unicast(proxy: Proxy) -> str | None:
    for ip in proxy.ip_addresses:
        addr = ipaddress.ip_address(ip)
        if not (addr.is_loopback or addr.is_multicast or addr.is_link_local or addr.is_unspecified):
            return ip
    return None


def _service_targets(proxy: Proxy) -> list[InboundPort]:
    seen: dict[int, InboundPort] = {}
    for target in proxy.service_targets:
        if target.port.protocol is Protocol.UDP or target.target_port in seen:
            continue
        seen[target.target_port] = InboundPort(
            port=target.target_port,
            protocol=target.port.protocol,
            cluster=names.inbound_cluster(target.target_port),
            hostname=target.service.hostname,
            service_port=target.port.port,
            chain_name=names.listener_name(WILDCARD, target.target_port),
        )
    return [seen[p] for p in sorted(seen)]


def _ingress_ports(proxy: Proxy) -> list[tuple[InboundPort, Any]]:
    """The Sidecar's ingress listeners as inbound ports, as istiod's buildInboundChainConfigs."""
    scope = proxy.sidecar_scope
    assert scope is not None
    # Without a bind, a listener takes the proxy's global unicast address, else the wildcard.
    bind_default = _global_unicast(proxy) or WILDCARD
    # Sidecar ports have no real hostname; telemetry and the route decorator use the Sidecar's name.
    hostname = f"{scope.name}.{scope.namespace}"
    out = []
    seen: set[int] = set()
    for ingress in scope.ingress:
        number = ingress.port.number
        protocol = Protocol.parse(ingress.port.protocol)
        if number in seen or not _ingress_can_bind(proxy, ingress, protocol):
            continue
        seen.add(number)
        bind = ingress.bind or bind_default
        out.append(
            (
                InboundPort(
                    port=number,
                    protocol=protocol,
                    cluster=names.inbound_cluster(number),
                    hostname=hostname,
                    service_port=number,
                    chain_name=names.listener_name(bind, number),
                    config=config_path("sidecar", scope.namespace, scope.name),
                ),
                ingress,
            )
        )
    return out


def _ingress_can_bind(proxy: Proxy, ingress: Any, protocol: Protocol) -> bool:
    """istiod's CanBindToPort: no privileged port for an unprivileged pod, no clash with Envoy's own."""
    number = ingress.port.number
    if _ingress_binds_port(proxy, ingress) and number < 1024 and proxy.metadata.unprivileged_pod:
        return False
    on_wildcard = ingress.bind == WILDCARD or (not ingress.bind and protocol.is_http)
    return not (on_wildcard and number in _STATIC_LISTENER_PORTS)


def _ingress_binds_port(proxy: Proxy, ingress: Any) -> bool:
    if ingress.capture_mode == CAPTURE_NONE:
        return True
    if ingress.capture_mode == CAPTURE_IPTABLES:
        return False
    return proxy.interception_mode is InterceptionMode.NONE


def _inspectors(listener: Any, *, tls: bool, http_disabled_ports: list[int], http: bool) -> None:
    if tls:
        listener.listener_filters.append(tls_inspector())
    if http:
        inspector = http_inspector()
        if http_disabled_ports:
            inspector.filter_disabled.CopyFrom(_ports_predicate(http_disabled_ports))
        listener.listener_filters.append(inspector)


def _ports_predicate(ports: list[int]) -> Any:
    predicates = [
        listener_components_pb2.ListenerFilterChainMatchPredicate(
            destination_port_range=range_pb2.Int32Range(start=p, end=p + 1)
        )
        for p in sorted(set(ports))
    ]
    if len(predicates) == 1:
        return predicates[0]
    out = listener_components_pb2.ListenerFilterChainMatchPredicate()
    out.or_match.rules.extend(predicates)
    return out


def virtual_inbound(proxy: Proxy, push: PushContext, targets: list[InboundPort]) -> Any:
    """0.0.0.0:15006, where capture sends inbound traffic; one chain set per workload port."""
    port = push.mesh.proxy_inbound_listen_port
    listener = listener_pb2.Listener(
        name=names.VIRTUAL_INBOUND,
        address=address_pb2.Address(
            socket_address=address_pb2.SocketAddress(address=WILDCARD, port_value=port)
        ),
        traffic_direction=base_pb2.INBOUND,
        continue_on_listener_filters_timeout=True,
    )
    listener.max_connections_to_accept_per_socket_event.value = 1
    listener.listener_filters_timeout.CopyFrom(push.mesh.protocol_detection_timeout)
    if proxy.interception_mode is InterceptionMode.TPROXY:
        listener.transparent.value = True
    listener.listener_filters.append(
        listener_components_pb2.ListenerFilter(
            name="envoy.filters.listener.original_dst", typed_config=pack(original_dst_pb2.OriginalDst())
        )
    )
    tls = tls_inspector()
    tls.filter_disabled.CopyFrom(_ports_predicate([port]))
    listener.listener_filters.append(tls)
    http_off = [port] + [t.port for t in targets if t.protocol.is_http or t.protocol.is_tcp]
    listener.listener_filters.append(http_inspector())
    listener.listener_filters[-1].filter_disabled.CopyFrom(_ports_predicate(http_off))

    blackhole = listener.filter_chains.add(name=names.VIRTUAL_INBOUND_BLACKHOLE)
    blackhole.filter_chain_match.destination_port.value = port
    blackhole.filters.append(tcp_proxy(names.BLACKHOLE_CLUSTER))
    passthrough = InboundPort(
        port=0,
        protocol=Protocol.UNSUPPORTED,
        cluster=names.INBOUND_PASSTHROUGH_CLUSTER,
        hostname="",
        service_port=0,
        chain_name=names.VIRTUAL_INBOUND,
    )
    listener.filter_chains.extend(
        permissive_chains(
            proxy,
            push,
            passthrough,
            port=None,
            name=names.VIRTUAL_INBOUND,
            http_name=names.VIRTUAL_INBOUND_CATCHALL_HTTP,
        )
    )
    for target in targets:
        listener.filter_chains.extend(
            permissive_chains(proxy, push, target, port=target.port, name=target.chain_name)
        )
    return listener


def ingress_listener(proxy: Proxy, push: PushContext, target: InboundPort, bind: str) -> Any:
    """A Sidecar ingress listener bound to its own port (no capture)."""
    listener = listener_pb2.Listener(
        name=target.chain_name,
        address=socket_address(bind, target.port),
        traffic_direction=base_pb2.INBOUND,
        continue_on_listener_filters_timeout=True,
    )
    listener.max_connections_to_accept_per_socket_event.value = 1
    listener.listener_filters_timeout.CopyFrom(push.mesh.protocol_detection_timeout)
    sniffed = not (target.protocol.is_http or target.protocol.is_tcp)
    _inspectors(listener, tls=True, http_disabled_ports=[], http=sniffed)
    listener.filter_chains.extend(
        permissive_chains(proxy, push, target, port=target.port, name=target.chain_name)
    )
    return listener


def build_inbound_listeners(proxy: Proxy, push: PushContext) -> list[Any]:
    scope = proxy.sidecar_scope
    assert scope is not None
    capture = proxy.interception_mode is not InterceptionMode.NONE
    if scope.has_ingress:
        in_virtual: list[InboundPort] = []
        bound = []
        for target, ingress in _ingress_ports(proxy):
            if _ingress_binds_port(proxy, ingress):
                bound.append(ingress_listener(proxy, push, target, target.chain_name.rsplit("_", 1)[0]))
            else:
                in_virtual.append(target)
        out = [virtual_inbound(proxy, push, in_virtual)] if capture else []
        return out + bound
    if not capture:
        return []
    return [virtual_inbound(proxy, push, _service_targets(proxy))]
