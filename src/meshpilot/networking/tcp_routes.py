"""VirtualService ``tcp`` and ``tls`` routes as filter chains of a sidecar's outbound listener.

istiod builds these in ``networking/core/tls.go`` (buildSidecarOutboundTLSFilterChainOpts,
buildSidecarOutboundTCPFilterChainOpts). A match has static predicates (gateways,
sourceLabels, sourceNamespace, port), decided here for the proxy, and runtime
predicates (sniHosts, destinationSubnets), which become the chain's
FilterChainMatch for Envoy to decide per connection.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.config.listener.v3 import listener_components_pb2

from meshpilot.model.destination_rules import MergedDestinationRule
from meshpilot.model.gateways import GatewayRef, gateway_match
from meshpilot.model.hosts import host_matches, resolve_short_name
from meshpilot.model.labels import selector_matches
from meshpilot.model.protocol import Protocol
from meshpilot.model.proxy import Proxy
from meshpilot.model.push_context import PushContext, VirtualServiceEntry
from meshpilot.model.service import UNSPECIFIED_IP, Service
from meshpilot.model.telemetry import TelemetryClass
from meshpilot.networking import access_log, http_routes, names
from meshpilot.networking.cluster import config_path
from meshpilot.networking.filters import TcpProxyOptions, tcp_proxy
from meshpilot.networking.protobuf import uint32


@dataclass(frozen=True, slots=True)
class RouteChain:
    """One filter chain for a service port: its runtime match, its filters, where it came from."""

    build: Callable[[], list[Any]]
    sni_hosts: tuple[str, ...] = ()
    cidrs: tuple[str, ...] = ()
    #: The ``istio.config`` metadata naming the VirtualService, or None.
    metadata: Any | None = None


def filter_chain_match(
    sni_hosts: Sequence[str] = (),
    cidrs: Sequence[str] = (),
    alpns: Sequence[str] = (),
    transport: str = "",
) -> Any | None:
    """The FilterChainMatch istiod writes; None when the chain matches everything.

    A ``*`` server name matches any, so it is no match at all; server names and
    prefixes are sorted (istiod sorts them) so equal matches compare equal.
    """
    if "*" in sni_hosts:
        sni_hosts = ()
    ranges = [r for r in (_cidr_range(c) for c in sorted(cidrs)) if r is not None]
    if not sni_hosts and not ranges and not alpns and not transport:
        return None
    match = listener_components_pb2.FilterChainMatch(
        server_names=sorted(sni_hosts), application_protocols=list(alpns), transport_protocol=transport
    )
    for address, length in ranges:
        match.prefix_ranges.add(address_prefix=address, prefix_len=uint32(length))
    return match


def _cidr_range(text: str) -> tuple[str, int] | None:
    """An address or CIDR as (prefix, length); None for the unspecified address or bad text."""
    address, _, length = text.partition("/")
    try:
        ip = ipaddress.ip_address(address)
        bits = int(length) if length else ip.max_prefixlen
    except ValueError:
        return None
    if address == UNSPECIFIED_IP or not 0 <= bits <= ip.max_prefixlen:
        return None
    return str(ip), bits


def match_conflict_key(match: Any | None) -> tuple[object, ...]:
    """Two chains conflict (Envoy rejects both) when these are equal, as istiod's conflictsWith decides.

    CIDRs are compared masked: 10.1.0.0/8 and 10.2.0.0/8 are the same range.
    """
    if match is None:
        return ("", (), frozenset(), frozenset())
    ranges = set()
    for r in match.prefix_ranges:
        length = r.prefix_len.value if r.HasField("prefix_len") else None
        try:
            net = ipaddress.ip_network(
                f"{r.address_prefix}/{length}" if length is not None else r.address_prefix, strict=False
            )
        except ValueError:
            continue
        ranges.add(str(net))
    return (
        match.transport_protocol,
        tuple(match.application_protocols),
        frozenset(s for s in match.server_names if s != "*"),
        frozenset(ranges),
    )


# -- static predicates ------------------------------------------------------------


def static_match(
    match: Any, proxy: Proxy, port: int, vs_namespace: str = "", gateway: GatewayRef | None = None
) -> bool:
    """gateways, sourceLabels, port and sourceNamespace, the same for L4 and TLS matches; for
    sidecars, or on ``gateway`` (whose name a match's gateways give relative to ``vs_namespace``)."""
    gateways_ok = not match.gateways or gateway_match(match.gateways, vs_namespace, gateway)
    labels_ok = selector_matches(dict(match.source_labels), proxy.labels)
    port_ok = match.port == 0 or match.port == port
    namespace_ok = not match.source_namespace or match.source_namespace == proxy.config_namespace
    return gateways_ok and labels_ok and port_ok and namespace_ok


def virtual_services_for_host(
    hostname: str, virtual_services: Sequence[VirtualServiceEntry]
) -> list[VirtualServiceEntry]:
    """The VirtualServices one of whose hosts matches the service's (either may be a wildcard)."""
    return [vs for vs in virtual_services if any(host_matches(h, hostname) for h in vs.hosts)]


def listeners_read(spec: Any) -> bool:
    """Whether a sidecar's outbound listeners read anything of this VirtualService: its tcp and tls
    routes are all they read of one (``service_chains``; ``xds.dependencies.listeners_kept``)."""
    return bool(spec.tcp or spec.tls)


def uses_source_labels(virtual_services: Sequence[VirtualServiceEntry]) -> bool:
    """Whether a tcp or tls match depends on the proxy's labels (then listeners are shared only by
    proxies with the same labels: ``source_label_key``)."""
    return _any_l4_match(virtual_services, "source_labels")


def uses_source_namespace(virtual_services: Sequence[VirtualServiceEntry]) -> bool:
    """Whether a tcp or tls match depends on the proxy's namespace (``static_match``)."""
    return _any_l4_match(virtual_services, "source_namespace")


def _any_l4_match(virtual_services: Sequence[VirtualServiceEntry], field: str) -> bool:
    for vs in virtual_services:
        spec = vs.config.spec
        for route in (*spec.tcp, *spec.tls):
            if any(getattr(m, field) for m in route.match):
                return True
    return False


# -- filters ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RouteContext:
    """What building a route's tcp_proxy reads: the proxy's view and the listener port."""

    proxy: Proxy
    push: PushContext
    listen_port: int

    def service(self, hostname: str) -> Service | None:
        scope = self.proxy.sidecar_scope
        return scope.service(hostname) if scope is not None else None

    def rule(self, hostname: str) -> MergedDestinationRule | None:
        scope = self.proxy.sidecar_scope
        return scope.destination_rule(hostname) if scope is not None else None


def connection_loggers(ctx: RouteContext) -> list[Any]:
    """The access loggers of an outbound (or gateway) tcp_proxy: the client side's."""
    return access_log.filter_loggers(ctx.push, ctx.proxy, TelemetryClass.CLIENT, http=False)


def destination_cluster(ctx: RouteContext, destination: Any, vs_namespace: str) -> str:
    """``outbound|port|subset|host`` for a route destination, as istiod's GetDestinationCluster.

    The port is the destination's, else the service's only port, else the listener's.
    """
    hostname = resolve_short_name(destination.host, vs_namespace, ctx.push.domain_suffix)
    return http_routes.destination_cluster(destination, ctx.service(hostname), ctx.listen_port, hostname)


def proxy_options(rule: MergedDestinationRule | None, subset: str) -> TcpProxyOptions:
    """Idle timeout, connection duration and source-IP hashing from a DestinationRule.

    The timeouts come from the rule's own policy; a subset's load balancer
    decides source-IP hashing for that subset.
    """
    if rule is None:
        return TcpProxyOptions()
    policy = rule.traffic_policy
    tcp = policy.connection_pool.tcp if policy is not None else None
    source_ip = policy is not None and policy.load_balancer.consistent_hash.use_source_ip
    found = rule.subset(subset)
    if found is not None and found.traffic_policy.HasField("load_balancer"):
        lb = found.traffic_policy.load_balancer
        source_ip = lb.HasField("consistent_hash") and lb.consistent_hash.use_source_ip
    idle = tcp.idle_timeout if tcp is not None and tcp.HasField("idle_timeout") else None
    longest = (
        tcp.max_connection_duration if tcp is not None and tcp.HasField("max_connection_duration") else None
    )
    return TcpProxyOptions(idle_timeout=idle, max_connection_duration=longest, hash_source_ip=bool(source_ip))


def route_filters(
    ctx: RouteContext, routes: Sequence[Any], vs: VirtualServiceEntry
) -> Callable[[], list[Any]]:
    """The tcp_proxy of a route: one cluster, or weighted clusters when it has several destinations."""
    namespace = vs.config.namespace
    first = resolve_short_name(routes[0].destination.host, namespace, ctx.push.domain_suffix)
    rule = ctx.rule(first) if ctx.service(first) is not None else None
    if len(routes) == 1:
        cluster = destination_cluster(ctx, routes[0].destination, namespace)
        options = proxy_options(rule, routes[0].destination.subset)
        return lambda: [tcp_proxy(cluster, options=options, access_log=connection_loggers(ctx))]
    weighted = [
        (destination_cluster(ctx, r.destination, namespace), r.weight) for r in routes if r.weight > 0
    ]
    options = proxy_options(rule, "")
    if not weighted:
        # Validation forbids this; a single cluster beats an empty weighted set Envoy would reject.
        cluster = destination_cluster(ctx, routes[0].destination, namespace)
        return lambda: [tcp_proxy(cluster, options=options, access_log=connection_loggers(ctx))]
    stat_prefix = f"{vs.config.name}.{namespace}"
    return lambda: [
        tcp_proxy(
            "",
            stat_prefix=stat_prefix,
            weighted=weighted,
            options=options,
            access_log=connection_loggers(ctx),
        )
    ]


def _config_metadata(vs: VirtualServiceEntry) -> Any:
    meta = base_pb2.Metadata()
    meta.filter_metadata["istio"].update(
        {"config": config_path("virtual-service", vs.config.namespace, vs.config.name)}
    )
    return meta


def _default_chain(
    ctx: RouteContext, svc: Service, cidrs: Sequence[str], sni_hosts: Sequence[str] = ()
) -> RouteChain:
    """To the service's own cluster: what a port without a matching route gets."""
    port = svc.ports[0].port if len(svc.ports) == 1 else ctx.listen_port
    cluster = names.outbound_cluster(port, "", svc.hostname)
    options = proxy_options(ctx.rule(svc.hostname), "")
    return RouteChain(
        lambda: [tcp_proxy(cluster, options=options, access_log=connection_loggers(ctx))],
        tuple(sni_hosts),
        tuple(cidrs),
    )


# -- chains ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ListenTarget:
    """Where a service port listens: an address, the CIDRs it matches there, the service's address.

    ``service_address`` is the address istiod calls the service's for this
    listener: the one listened on, the VIP under an explicit bind, "" for a CIDR.
    """

    address: str
    cidrs: tuple[str, ...] = ()
    service_address: str | None = None

    @property
    def own_address(self) -> str:
        return self.address if self.service_address is None else self.service_address


def service_chains(
    ctx: RouteContext,
    svc: Service,
    protocol: Protocol,
    target: ListenTarget,
    virtual_services: Sequence[VirtualServiceEntry],
) -> list[RouteChain]:
    """The TCP filter chains of one service port: TLS routes for TLS ports, TCP routes otherwise."""
    configs = virtual_services_for_host(svc.hostname, virtual_services)
    if protocol.is_tls:
        return tls_chains(ctx, svc, target, configs)
    return tcp_chains(ctx, svc, target.cidrs, configs)


def tls_chains(
    ctx: RouteContext,
    svc: Service,
    target: ListenTarget,
    configs: Sequence[VirtualServiceEntry],
) -> list[RouteChain]:
    """SNI chains of ``tls`` routes; without one, the service's own chain.

    Matches whose runtime predicates (sniHosts, destinationSubnets) were
    already handled are unreachable and skipped. As in istiod, a match's
    destinationSubnets replace the CIDRs for the matches after it too.
    """
    out: list[RouteChain] = []
    handled: set[tuple[tuple[str, ...], tuple[str, ...]]] = set()
    current = target.cidrs
    for vs in configs:
        for route in vs.config.spec.tls:
            if not route.route:
                continue
            for match in route.match:
                if not static_match(match, ctx.proxy, ctx.listen_port):
                    continue
                if match.destination_subnets and ctx.listen_port > 0:
                    current = tuple(match.destination_subnets)
                key = (tuple(match.sni_hosts), tuple(match.destination_subnets))
                if key not in handled:
                    build = route_filters(ctx, list(route.route), vs)
                    out.append(RouteChain(build, tuple(match.sni_hosts), current, _config_metadata(vs)))
                handled.add(key)
    if out:
        return out
    # Without a route, only the SNI can tell services on a shared wildcard listener apart.
    address = "" if "/" in target.own_address else target.own_address
    bind = target.address
    by_sni = bool(current) or not address or (address == UNSPECIFIED_IP and bind == UNSPECIFIED_IP)
    return [_default_chain(ctx, svc, current, (svc.hostname,) if by_sni else ())]


def tcp_chains(
    ctx: RouteContext, svc: Service, cidrs: Sequence[str], configs: Sequence[VirtualServiceEntry]
) -> list[RouteChain]:
    """Chains of ``tcp`` routes, in order, up to the first that matches every destination.

    Matches with destinationSubnets only are collected into one chain per
    route; a match without subnets (or no match at all) is the terminal one.
    """
    out: list[RouteChain] = []
    default_added = False
    for vs in configs:
        for route in vs.config.spec.tcp:
            if not route.route:
                continue
            if not route.match:
                out.append(
                    RouteChain(
                        route_filters(ctx, list(route.route), vs), (), tuple(cidrs), _config_metadata(vs)
                    )
                )
                return out
            subnets: list[str] = []
            for match in route.match:
                if not static_match(match, ctx.proxy, ctx.listen_port):
                    continue
                if not match.destination_subnets or ctx.listen_port == 0:
                    build = route_filters(ctx, list(route.route), vs)
                    out.append(RouteChain(build, (), tuple(cidrs), _config_metadata(vs)))
                    return out
                subnets.extend(match.destination_subnets)
            if subnets:
                out.append(RouteChain(route_filters(ctx, list(route.route), vs), (), tuple(subnets)))
                # The service's own chain would have the same match; Envoy rejects duplicates.
                if sorted(subnets) == sorted(cidrs):
                    default_added = True
    if not default_added:
        out.append(_default_chain(ctx, svc, cidrs))
    return out


def source_label_key(proxy: Proxy) -> tuple[tuple[str, str], ...] | None:
    """The proxy's labels when a tcp or tls route of its scope matches on them, else None.

    Outbound listeners are shared by the proxies of scopes with one outbound signature
    (``generators.lds``); with sourceLabels matches, only by proxies with the same labels.
    """
    scope = proxy.sidecar_scope
    if scope is None:
        return None
    uses = scope.memo.get("tcp_source_labels")
    if uses is None:
        uses = scope.memo["tcp_source_labels"] = any(
            uses_source_labels(e.virtual_services) for e in scope.egress
        )
    return tuple(sorted(proxy.labels.items())) if uses else None
