"""Outbound listeners of a sidecar (LDS): one per (bind, port), plus virtualOutbound.

Listeners are first collected as entries keyed by (bind address, port), so
services sharing a port merge as istiod merges them: HTTP services share one
listener and route; TCP or sniffed services on a VIP get their own; an HTTP
and a TCP service on one address become a sniffed listener holding both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from envoy.config.core.v3 import address_pb2, base_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.extensions.filters.listener.http_inspector.v3 import http_inspector_pb2
from envoy.extensions.filters.listener.tls_inspector.v3 import tls_inspector_pb2

from meshpilot.model.egress_imports import CAPTURE_NONE, EgressListener
from meshpilot.model.endpoint import Endpoint
from meshpilot.model.endpoint_index import EndpointIndex
from meshpilot.model.identity import IdentityEnum
from meshpilot.model.mesh import REGISTRY_ONLY
from meshpilot.model.protocol import Protocol
from meshpilot.model.proxy import InterceptionMode, Proxy
from meshpilot.model.push_context import PushContext, VirtualServiceEntry
from meshpilot.model.service import Port, Registry, Resolution, Service
from meshpilot.model.telemetry import TelemetryClass
from meshpilot.networking import access_log, names, stats_filters
from meshpilot.networking import endpoint as eds
from meshpilot.networking.filters import http_connection_manager, tcp_proxy
from meshpilot.networking.protobuf import boolean, duration, pack, uint32
from meshpilot.networking.tcp_routes import (
    ListenTarget,
    RouteChain,
    RouteContext,
    filter_chain_match,
    match_conflict_key,
    service_chains,
)
from meshpilot.networking.tracing import hcm_tracing

WILDCARD = "0.0.0.0"
LOCALHOST = "127.0.0.1"
HTTP_ALPNS = ("http/1.1", "h2c")
# Ports of the bootstrap's own listeners and the capture ports (istiod's CanBindToPort).
_RESERVED_PORTS = frozenset({15001, 15006, 15021, 15090})


class ListenerProtocol(IdentityEnum):
    HTTP = "HTTP"
    TCP = "TCP"
    #: Sniffed: an HTTP chain chosen by ALPN and a TCP fallback.
    AUTO = "AUTO"


def listener_protocol(protocol: Protocol) -> ListenerProtocol:
    if protocol.is_http:
        return ListenerProtocol.HTTP
    if protocol.is_tcp:
        return ListenerProtocol.TCP
    return ListenerProtocol.AUTO


@dataclass(slots=True)
class Chain:
    #: Builds the chain's filters; called only for chains that make it into a listener,
    #: since most candidate chains are merged away (every HTTP service of a port shares one).
    build: Callable[[], list[Any]]
    match: Any | None = None  # FilterChainMatch; None matches everything
    name: str = ""
    http: bool = False
    transport_socket: Any | None = None
    #: Filter chain metadata (the VirtualService a route chain came from).
    metadata: Any | None = None

    @property
    def match_all(self) -> bool:
        return self.match is None or not self.match.ByteSize()

    def match_key(self) -> tuple[object, ...]:
        """Equal for chains Envoy cannot tell apart (the second would be rejected)."""
        return match_conflict_key(self.match)


@dataclass(slots=True)
class Entry:
    bind: str
    port: int
    bind_to_port: bool
    protocol: ListenerProtocol
    chains: list[Chain] = field(default_factory=list)
    locked: bool = False


def _http_chain(proxy: Proxy, push: PushContext, bind: str, port: int, rds: str, *, alpn: bool) -> Chain:
    match = None
    if alpn:
        match = listener_components_pb2.FilterChainMatch(
            application_protocols=list(HTTP_ALPNS), transport_protocol="raw_buffer"
        )
    stat_prefix = names.stat_name(f"outbound_{names.listener_name(bind, port)}")

    def build() -> list[Any]:
        return [
            http_connection_manager(
                proxy,
                stat_prefix=stat_prefix,
                inbound=False,
                rds_name=rds,
                stats=stats_filters.http(push, proxy, TelemetryClass.CLIENT),
                access_log=access_log.filter_loggers(push, proxy, TelemetryClass.CLIENT, http=True),
                tracing=hcm_tracing(push, proxy, TelemetryClass.CLIENT),
            )
        ]

    return Chain(build, match, http=True)


def _wildcard_headless(svc: Service, endpoints: Sequence[Endpoint]) -> bool:
    """A ServiceEntry with resolution NONE, no addresses, no endpoints and no selector
    listens on the wildcard; one with endpoints gets a listener per endpoint, as a
    headless Kubernetes service does (istiod's buildSidecarOutboundListeners)."""
    return svc.registry is not Registry.KUBERNETES and svc.selector is None and not endpoints


def _route_chain(route: RouteChain) -> Chain:
    return Chain(route.build, filter_chain_match(route.sni_hosts, route.cidrs), metadata=route.metadata)


def _keeps_port(entry: Entry, kind: ListenerProtocol) -> bool:
    """Whether ``entry`` stays as it is when another service of ``kind`` comes to its port."""
    if entry.protocol is ListenerProtocol.HTTP and kind is ListenerProtocol.HTTP:
        return True  # one route configuration serves every HTTP service on the port
    # The first sniffed service keeps the port.
    return entry.protocol is ListenerProtocol.AUTO and kind is not ListenerProtocol.TCP


class OutboundBuilder:
    """Collects the entries of one sidecar's outbound listeners."""

    def __init__(self, proxy: Proxy, push: PushContext, index: EndpointIndex) -> None:
        self.proxy = proxy
        self.push = push
        self.index = index
        self.entries: dict[tuple[str, int], Entry] = {}
        self.tcp_stats = stats_filters.tcp(push, proxy, TelemetryClass.CLIENT)

    def add_egress_listener(self, egress: EgressListener) -> None:
        none_mode = self.proxy.interception_mode is InterceptionMode.NONE
        bind_to_port = none_mode or egress.capture_mode == CAPTURE_NONE or egress.bind.startswith("unix://")
        bind = egress.bind or (LOCALHOST if bind_to_port else "")
        for svc in egress.services:
            if svc.resolution is Resolution.ALIAS:
                continue
            ports = svc.ports
            override: Protocol | None = None
            if egress.port is not None:
                override = Protocol.parse(egress.port.protocol) if egress.port.protocol else None
            for port in ports:
                if port.protocol is Protocol.UDP:
                    continue
                listen_port = egress.port.number if egress.port is not None else port.port
                protocol = override or port.protocol
                self._add_service_port(
                    svc,
                    port,
                    listen_port,
                    protocol,
                    bind,
                    bind_to_port,
                    egress.port is None,
                    egress.virtual_services,
                )

    def lock_all(self) -> None:
        """Entries made by listeners with a port may not be changed by the catch-all listener."""
        for entry in self.entries.values():
            entry.locked = True

    def _add_service_port(
        self,
        svc: Service,
        port: Port,
        listen_port: int,
        protocol: Protocol,
        bind: str,
        bind_to_port: bool,
        catch_all: bool,
        virtual_services: Sequence[VirtualServiceEntry],
    ) -> None:
        kind = listener_protocol(protocol)
        targets: list[ListenTarget]
        if bind:
            # An explicit bind says nothing of the service's own address, which decides SNI matching.
            targets = [ListenTarget(bind, (), svc.default_address)]
        elif kind is ListenerProtocol.HTTP:
            targets = [ListenTarget(WILDCARD)]
        elif svc.is_headless:
            endpoints = eds.select_endpoints(self.index, svc, port.name, None)
            wildcard_only = _wildcard_headless(svc, endpoints)
            addresses = [WILDCARD] if wildcard_only else self._headless_addresses(endpoints)
            targets = [ListenTarget(a) for a in addresses]
        elif svc.addresses:
            # A CIDR cannot be bound: it listens on the wildcard and matches the destination range.
            targets = [
                ListenTarget(WILDCARD, (a,), "") if "/" in a else ListenTarget(a) for a in svc.addresses
            ]
        else:
            targets = [ListenTarget(WILDCARD)]
        for target in targets:
            address = target.address
            if not self._can_bind(address, listen_port, bind_to_port):
                continue
            key = (address, listen_port)
            existing = self.entries.get(key)
            if existing is not None and existing.locked and catch_all:
                continue
            if existing is not None and _keeps_port(existing, kind):
                # Decided before the chains are made: at 1,000 HTTP services on one port, all but
                # the first would build a chain only to drop it.
                continue
            wildcard = address == WILDCARD and not bind_to_port
            chains = self._chains(kind, svc, protocol, listen_port, target, wildcard, virtual_services)
            if existing is None:
                self.entries[key] = Entry(address, listen_port, bind_to_port, kind, chains)
            else:
                self._merge(existing, kind, chains)

    def _chains(
        self,
        kind: ListenerProtocol,
        svc: Service,
        protocol: Protocol,
        port: int,
        target: ListenTarget,
        wildcard: bool,
        virtual_services: Sequence[VirtualServiceEntry],
    ) -> list[Chain]:
        address = target.address
        if kind is ListenerProtocol.HTTP:
            # On the wildcard address an HTTP chain is chosen by ALPN so other
            # traffic to the port still passes through.
            return [_http_chain(self.proxy, self.push, address, port, str(port), alpn=wildcard)]
        ctx = RouteContext(self.proxy, self.push, port)
        routes = service_chains(ctx, svc, protocol, target, virtual_services)
        tcp = [_route_chain(r) for r in routes]
        if kind is ListenerProtocol.TCP:
            return tcp
        rds = str(port) if address == WILDCARD else f"{svc.hostname}:{port}"
        return [*tcp, _http_chain(self.proxy, self.push, address, port, rds, alpn=True)]

    def _merge(self, entry: Entry, kind: ListenerProtocol, chains: list[Chain]) -> None:
        existing = {c.match_key() for c in entry.chains if not c.http}
        for chain in chains:
            if chain.http:
                if not any(c.http for c in entry.chains):
                    entry.chains.append(self._with_alpn(chain, entry))
                continue
            if chain.match_key() in existing:
                continue  # a second service on the same address and port: the first wins
            # TCP chains keep their order, ahead of a sniffed HTTP chain.
            http_at = next((i for i, c in enumerate(entry.chains) if c.http), len(entry.chains))
            entry.chains.insert(http_at, chain)
            existing.add(chain.match_key())
        if any(c.http for c in entry.chains) and any(not c.http for c in entry.chains):
            entry.protocol = ListenerProtocol.AUTO
            entry.chains = [self._with_alpn(c, entry) if c.http else c for c in entry.chains]

    def _with_alpn(self, chain: Chain, entry: Entry) -> Chain:
        if not chain.match_all:
            return chain
        match = listener_components_pb2.FilterChainMatch(
            application_protocols=list(HTTP_ALPNS), transport_protocol="raw_buffer"
        )
        return Chain(chain.build, match, chain.name, chain.http, metadata=chain.metadata)

    def _headless_addresses(self, endpoints: Sequence[Endpoint]) -> list[str]:
        """Each endpoint IP of a headless service gets its own listener, except the proxy's own.

        Endpoints addressed by name (possible for ServiceEntries) cannot be listened on.
        """
        own = set(self.proxy.ip_addresses)
        found = []
        for ep in endpoints:
            if ep.is_ip and ep.address not in own and ep.address not in found:
                found.append(ep.address)
        return found

    def _can_bind(self, address: str, port: int, bind_to_port: bool) -> bool:
        if not bind_to_port:
            return True
        if port < 1024 and self.proxy.metadata.unprivileged_pod:
            return False
        return not (address == WILDCARD and port in _RESERVED_PORTS)

    # -- output -----------------------------------------------------------------

    def listeners(self) -> list[Any]:
        return [self._listener(self.entries[key]) for key in sorted(self.entries, key=lambda k: (k[1], k[0]))]

    def _passthrough_chain(self) -> Chain:
        cluster = catch_all_cluster(self.proxy)
        loggers = access_log.filter_loggers(self.push, self.proxy, TelemetryClass.CLIENT, http=False)
        return Chain(
            lambda: [tcp_proxy(cluster, access_log=loggers)],
            listener_components_pb2.FilterChainMatch(),
            names.PASSTHROUGH_FILTER_CHAIN,
        )

    def _listener(self, entry: Entry) -> Any:
        name = names.listener_name(entry.bind, entry.port)
        listener = listener_pb2.Listener(
            name=name,
            address=eds.socket_address(entry.bind, entry.port),
            traffic_direction=base_pb2.OUTBOUND,
            continue_on_listener_filters_timeout=True,
        )
        if entry.bind_to_port:
            listener.max_connections_to_accept_per_socket_event.value = 1
        else:
            listener.bind_to_port.value = False
        chains = list(entry.chains)
        match_all = [c for c in chains if c.match_all]
        default: Chain | None = None
        if len(chains) == 1 and match_all:
            pass
        elif match_all:
            default = match_all[0]
            chains = [c for c in chains if c is not default]
        else:
            default = self._passthrough_chain()
        for chain in chains:
            listener.filter_chains.append(_render(chain, self.tcp_stats, connect_timeout=True))
        if default is not None:
            listener.default_filter_chain.CopyFrom(
                _render(
                    default, self.tcp_stats, connect_timeout=default.name != names.PASSTHROUGH_FILTER_CHAIN
                )
            )
        all_chains = [*chains, *([default] if default else [])]
        if any(c.match is not None and c.match.server_names for c in all_chains):
            listener.listener_filters.append(tls_inspector())
        if any(c.match is not None and c.match.application_protocols for c in all_chains):
            listener.listener_filters.append(http_inspector())
        listener.listener_filters_timeout.CopyFrom(self.push.mesh.protocol_detection_timeout)
        return listener


def _render(chain: Chain, tcp_stats: Sequence[Any], *, connect_timeout: bool) -> Any:
    filters = stats_filters.before_tcp_proxy(chain.build(), tcp_stats)
    out = listener_components_pb2.FilterChain(filters=filters, name=chain.name)
    if chain.match is not None:
        out.filter_chain_match.CopyFrom(chain.match)
    if chain.transport_socket is not None:
        out.transport_socket.CopyFrom(chain.transport_socket)
    if chain.metadata is not None:
        out.metadata.CopyFrom(chain.metadata)
    if connect_timeout:
        out.transport_socket_connect_timeout.CopyFrom(duration(15))
    return out


def catch_all_cluster(proxy: Proxy) -> str:
    """Where TCP to unknown destinations goes, as istiod's buildOutboundCatchAllNetworkFiltersOnly.

    Nowhere under REGISTRY_ONLY; otherwise out as it came, or to the Sidecar's
    egressProxy when it names one.
    """
    scope = proxy.sidecar_scope
    if scope is not None and scope.outbound_traffic_policy == REGISTRY_ONLY:
        return names.BLACKHOLE_CLUSTER
    egress = scope.egress_proxy if scope is not None else None
    if egress is None or not egress.host:
        return names.PASSTHROUGH_CLUSTER
    port = egress.port.number if egress.HasField("port") else 0
    return names.outbound_cluster(port, egress.subset, egress.host)


def tls_inspector() -> Any:
    return listener_components_pb2.ListenerFilter(
        name="envoy.filters.listener.tls_inspector",
        typed_config=pack(tls_inspector_pb2.TlsInspector(initial_read_buffer_size=uint32(512))),
    )


def http_inspector() -> Any:
    return listener_components_pb2.ListenerFilter(
        name="envoy.filters.listener.http_inspector", typed_config=pack(http_inspector_pb2.HttpInspector())
    )


def virtual_outbound(proxy: Proxy, push: PushContext) -> Any:
    """0.0.0.0:15001, where capture sends outbound traffic; dispatches by original destination."""
    port = push.mesh.proxy_listen_port
    catchall = catch_all_cluster(proxy)
    listener = listener_pb2.Listener(
        name=names.VIRTUAL_OUTBOUND,
        address=address_pb2.Address(
            socket_address=address_pb2.SocketAddress(address=WILDCARD, port_value=port)
        ),
        use_original_dst=boolean(True),
        traffic_direction=base_pb2.OUTBOUND,
    )
    listener.max_connections_to_accept_per_socket_event.value = 1
    if proxy.interception_mode is InterceptionMode.TPROXY:
        listener.transparent.value = True
    stats = stats_filters.tcp(push, proxy, TelemetryClass.CLIENT)
    blackhole = listener.filter_chains.add(name=names.VIRTUAL_OUTBOUND_BLACKHOLE)
    blackhole.filter_chain_match.destination_port.value = port
    blackhole.filters.extend([*stats, tcp_proxy(names.BLACKHOLE_CLUSTER)])
    loggers = access_log.filter_loggers(push, proxy, TelemetryClass.CLIENT, http=False)
    listener.filter_chains.add(
        name=names.VIRTUAL_OUTBOUND_CATCHALL_TCP, filters=[*stats, tcp_proxy(catchall, access_log=loggers)]
    )
    # Connections no chain takes (NR) reach no filter's logger; the listener's logs them.
    listener.access_log.extend(access_log.listener_loggers(push, proxy, TelemetryClass.CLIENT))
    return listener


def build_outbound_listeners(proxy: Proxy, push: PushContext, index: EndpointIndex) -> list[Any]:
    scope = proxy.sidecar_scope
    assert scope is not None
    builder = OutboundBuilder(proxy, push, index)
    with_port = [e for e in scope.egress if e.port is not None]
    catch_all = [e for e in scope.egress if e.port is None]
    for egress in with_port:
        builder.add_egress_listener(egress)
    if with_port:
        builder.lock_all()
    for egress in catch_all:
        builder.add_egress_listener(egress)
    out = builder.listeners()
    if proxy.interception_mode is not InterceptionMode.NONE and push.mesh.proxy_listen_port > 0:
        out.append(virtual_outbound(proxy, push))
    return out
