"""Inbound listeners of a sidecar: virtualInbound (captured traffic) and Sidecar ingress listeners.

Each port's filter chains follow its PeerAuthentication mode (``model/peer_authentication.py``), as
istiod builds them: STRICT has only mutual-TLS chains (plaintext matches no chain and is refused),
PERMISSIVE (the default) accepts mutual TLS from mesh peers and plaintext from anyone, DISABLE has
only plaintext chains. The passthrough chains (traffic to ports no service names) take the
workload's mode, plus a chain set per port a policy names at port level that no service serves.
Listener filters (TLS and HTTP inspectors) are derived from the chains, as istiod derives them.
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

from meshpilot.model.egress_imports import CAPTURE_IPTABLES, CAPTURE_NONE
from meshpilot.model.peer_authentication import MtlsMode, WorkloadMtls
from meshpilot.model.protocol import Protocol
from meshpilot.model.proxy import InterceptionMode, Proxy
from meshpilot.model.push_context import PushContext
from meshpilot.model.telemetry import TelemetryClass
from meshpilot.networking import (
    access_log,
    extensions,
    inbound_security,
    metadata_exchange,
    names,
    stats_filters,
)
from meshpilot.networking.cluster import config_path
from meshpilot.networking.endpoint import socket_address
from meshpilot.networking.filters import http_connection_manager, tcp_proxy
from meshpilot.networking.listener import HTTP_ALPNS, WILDCARD, http_inspector, tls_inspector
from meshpilot.networking.protobuf import boolean, duration, pack
from meshpilot.networking.tls import istio_mutual_downstream, tls_transport_socket
from meshpilot.networking.tracing import hcm_tracing

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


def _exchange(proxy: Proxy) -> list[Any]:
    """istiod's inbound chains, HTTP and TCP, start with metadata exchange: it strips the exchange a
    client sent before RBAC or the application sees the stream (the chains' ALPN offers it)."""
    return [metadata_exchange.listener_filter()] if extensions.has_tcp_metadata_exchange(proxy) else []


def _hcm_filters(proxy: Proxy, push: PushContext, target: InboundPort, stat_prefix: str) -> list[Any]:
    return [
        *_exchange(proxy),
        http_connection_manager(
            proxy,
            stat_prefix=stat_prefix,
            inbound=True,
            route_config=_inbound_route(target),
            http2=target.protocol.is_http2,
            security=inbound_security.filters(proxy, push).http,
            stats=stats_filters.http(push, proxy, TelemetryClass.SERVER),
            access_log=access_log.filter_loggers(push, proxy, TelemetryClass.SERVER, http=True),
            tracing=hcm_tracing(push, proxy, TelemetryClass.SERVER),
        ),
    ]


def _tcp_filters(proxy: Proxy, push: PushContext, target: InboundPort) -> list[Any]:
    loggers = access_log.filter_loggers(push, proxy, TelemetryClass.SERVER, http=False)
    return [
        *_exchange(proxy),
        *inbound_security.filters(proxy, push).tcp,
        *stats_filters.tcp(push, proxy, TelemetryClass.SERVER),
        tcp_proxy(target.cluster, access_log=loggers),
    ]


@dataclass(frozen=True, slots=True)
class ChainOption:
    """One filter chain of a port: what it matches, whether it terminates mTLS, HTTP or TCP
    (istiod's FilterChainMatchOptions)."""

    transport: str
    http: bool
    alpns: tuple[str, ...] = ()
    mtls: bool = False


_TLS, _RAW = "tls", "raw_buffer"
#: The chains of a port by listener protocol and mTLS mode, in istiod's order
#: (pilot/pkg/networking/core/filterchain_options.go). DISABLE (and UNKNOWN) is plaintext only.
_CHAIN_OPTIONS: dict[tuple[str, MtlsMode], tuple[ChainOption, ...]] = {
    ("http", MtlsMode.STRICT): (ChainOption(_TLS, True, mtls=True),),
    ("http", MtlsMode.PERMISSIVE): (
        ChainOption(_TLS, True, ALL_ISTIO_ALPNS, mtls=True),
        ChainOption(_RAW, True),
    ),
    ("http", MtlsMode.DISABLE): (ChainOption(_RAW, True),),
    ("tcp", MtlsMode.STRICT): (ChainOption(_TLS, False, mtls=True),),
    ("tcp", MtlsMode.PERMISSIVE): (
        ChainOption(_TLS, False, ALL_ISTIO_ALPNS, mtls=True),
        ChainOption(_TLS, False),
        ChainOption(_RAW, False),
    ),
    ("tcp", MtlsMode.DISABLE): (ChainOption(_RAW, False),),
    ("auto", MtlsMode.STRICT): (
        ChainOption(_TLS, True, ISTIO_HTTP_ALPNS, mtls=True),
        ChainOption(_TLS, False, mtls=True),
    ),
    ("auto", MtlsMode.PERMISSIVE): (
        ChainOption(_TLS, True, ISTIO_HTTP_ALPNS, mtls=True),
        ChainOption(_RAW, True, HTTP_ALPNS),
        ChainOption(_TLS, False, ISTIO_TCP_ALPNS, mtls=True),
        ChainOption(_RAW, False),
        ChainOption(_TLS, False),
    ),
    ("auto", MtlsMode.DISABLE): (ChainOption(_RAW, True, HTTP_ALPNS), ChainOption(_RAW, False)),
}


def chain_options(protocol: Protocol, mode: MtlsMode) -> tuple[ChainOption, ...]:
    """The chains istiod builds for a port of ``protocol`` in ``mode`` (getFilterChainMatchOptions)."""
    kind = "http" if protocol.is_http else "tcp" if protocol.is_tcp else "auto"
    if mode is MtlsMode.UNKNOWN:
        mode = MtlsMode.DISABLE
    return _CHAIN_OPTIONS[(kind, mode)]


def inbound_chains(
    proxy: Proxy,
    push: PushContext,
    target: InboundPort,
    mode: MtlsMode,
    *,
    port: int | None,
    name: str,
    http_name: str = "",
    passthrough: bool = False,
) -> list[Any]:
    """The chains of one port in ``mode``: STRICT only mTLS, PERMISSIVE mTLS and plaintext, DISABLE
    only plaintext; HTTP and TCP as the protocol allows."""
    stat_prefix = (
        names.stat_name(names.INBOUND_PASSTHROUGH_CLUSTER)
        if passthrough or port is None
        else names.stat_name(f"inbound_{target.chain_name}")
    )
    http_name = http_name or name
    out = []
    for option in chain_options(target.protocol, mode):
        match = _match(port, option.transport, option.alpns)
        if option.http:
            chain_name, filters = http_name, _hcm_filters(proxy, push, target, stat_prefix)
        else:
            chain_name, filters = name, _tcp_filters(proxy, push, target)
        chain = listener_components_pb2.FilterChain(
            name=chain_name, filter_chain_match=match, filters=filters
        )
        if option.mtls:
            chain.transport_socket.CopyFrom(_downstream_tls(proxy, push, http=option.http))
        if target.config:
            chain.metadata.filter_metadata["istio"].update({"config": target.config})
        out.append(chain)
    return out


def workload_mtls(proxy: Proxy, push: PushContext) -> WorkloadMtls:
    """The proxy's workload's effective PeerAuthentication (istiod's authn builder for the proxy)."""
    return push.peer_authentication.for_workload(proxy.config_namespace, proxy.labels)


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


def _derived_inspectors(chains: list[Any]) -> list[Any]:
    """The TLS and HTTP inspectors the chains need, per destination port (istiod's
    populateListenerFilters): TLS where a chain matches ``tls``, HTTP where one matches a
    plaintext HTTP ALPN; port 0 stands for chains without a port (the passthrough ones)."""
    needs: dict[int, tuple[bool, bool]] = {}
    for chain in chains:
        match = chain.filter_chain_match
        port = match.destination_port.value if match.HasField("destination_port") else 0
        tls = match.transport_protocol == _TLS
        http = any(alpn in HTTP_ALPNS for alpn in match.application_protocols)
        had_tls, had_http = needs.get(port, (False, False))
        needs[port] = (had_tls or tls, had_http or http)
    out = []
    if any(tls for tls, _ in needs.values()):
        inspector = tls_inspector()
        default_on = needs.get(0, (False, False))[0]
        # With the passthrough inspecting, ports opt out; otherwise ports opt in.
        ports = sorted(p for p, (tls, _) in needs.items() if p != 0 and tls != default_on)
        if ports:
            predicate = _ports_predicate(ports)
            if not default_on:
                predicate = listener_components_pb2.ListenerFilterChainMatchPredicate(not_match=predicate)
            inspector.filter_disabled.CopyFrom(predicate)
        out.append(inspector)
    if any(http for _, http in needs.values()):
        inspector = http_inspector()
        off = sorted(p for p, (_, http) in needs.items() if not http)
        if off:
            inspector.filter_disabled.CopyFrom(_ports_predicate(off))
        out.append(inspector)
    return out


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


def _passthrough_port(port: int) -> InboundPort:
    return InboundPort(
        port=port,
        protocol=Protocol.UNSUPPORTED,
        cluster=names.INBOUND_PASSTHROUGH_CLUSTER,
        hostname="",
        service_port=0,
        chain_name=names.VIRTUAL_INBOUND,
    )


def _passthrough_chains(
    proxy: Proxy, push: PushContext, mtls: WorkloadMtls, served: frozenset[int]
) -> list[Any]:
    """istiod's ForPassthrough: the workload's mode for any port, then a chain set for each
    port-level port no service (or Sidecar ingress) serves, in that port's mode."""
    chains = []
    ports: list[int | None] = [None, *(p for p in mtls.ports if p not in served)]
    for port in ports:
        mode = mtls.mode if port is None else mtls.for_port(port)
        chains.extend(
            inbound_chains(
                proxy,
                push,
                _passthrough_port(port or 0),
                mode,
                port=port,
                name=names.VIRTUAL_INBOUND,
                http_name=names.VIRTUAL_INBOUND_CATCHALL_HTTP,
                passthrough=True,
            )
        )
    return chains


def virtual_inbound(
    proxy: Proxy, push: PushContext, targets: list[InboundPort], served: frozenset[int] | None = None
) -> Any:
    """0.0.0.0:15006, where capture sends inbound traffic; one chain set per workload port.

    ``served`` are the ports that need no passthrough chain of their own (default: ``targets``').
    """
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
    blackhole = listener.filter_chains.add(name=names.VIRTUAL_INBOUND_BLACKHOLE)
    blackhole.filter_chain_match.destination_port.value = port
    blackhole.filters.extend(
        [
            *_exchange(proxy),
            *stats_filters.tcp(push, proxy, TelemetryClass.SERVER),
            tcp_proxy(names.BLACKHOLE_CLUSTER),
        ]
    )
    mtls = workload_mtls(proxy, push)
    if served is None:
        served = frozenset(t.port for t in targets)
    listener.filter_chains.extend(_passthrough_chains(proxy, push, mtls, served))
    for target in targets:
        listener.filter_chains.extend(
            inbound_chains(
                proxy, push, target, mtls.for_port(target.port), port=target.port, name=target.chain_name
            )
        )
    listener.listener_filters.extend(_derived_inspectors(list(listener.filter_chains)))
    # Connections no chain takes (NR) reach no filter's logger; the listener's logs them.
    listener.access_log.extend(access_log.listener_loggers(push, proxy, TelemetryClass.SERVER))
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
    mode = workload_mtls(proxy, push).for_port(target.port)
    listener.filter_chains.extend(
        inbound_chains(proxy, push, target, mode, port=target.port, name=target.chain_name)
    )
    listener.listener_filters.extend(_derived_inspectors(list(listener.filter_chains)))
    # Connections no chain takes (NR) reach no filter's logger; the listener's logs them.
    listener.access_log.extend(access_log.listener_loggers(push, proxy, TelemetryClass.SERVER))
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
        # With a Sidecar, its ingress ports (bound or not) are the ports that are served.
        served = frozenset(i.port.number for i in scope.ingress)
        out = [virtual_inbound(proxy, push, in_virtual, served)] if capture else []
        return out + bound
    if not capture:
        return []
    return [virtual_inbound(proxy, push, _service_targets(proxy))]
