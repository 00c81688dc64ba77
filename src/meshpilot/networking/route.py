"""Route configurations of a sidecar (RDS): virtual hosts per service and VirtualService.

A route name is either a port (``"9080"``: every HTTP service on the port) or
``"<fqdn>:<port>"`` for a sniffed listener on a service VIP, which gets only
that service's virtual host.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.config.route.v3 import route_pb2

from meshpilot.model.config import Config, ConfigKey
from meshpilot.model.confighash import hash_value
from meshpilot.model.destination_rules import MergedDestinationRule
from meshpilot.model.gateways import GatewayRef
from meshpilot.model.hosts import host_matches, is_wildcard, resolve_short_name
from meshpilot.model.kind import Kind
from meshpilot.model.mesh import REGISTRY_ONLY
from meshpilot.model.protocol import Protocol
from meshpilot.model.proxy import Proxy
from meshpilot.model.push_context import PushContext, VirtualServiceEntry
from meshpilot.model.service import Port, Resolution, Service
from meshpilot.model.sidecar_scope import SidecarScope
from meshpilot.networking import names, vhosts, vhosts_py
from meshpilot.networking.http_routes import destination_cluster, routes_for_virtual_service
from meshpilot.networking.protobuf import boolean, duration, serialize, uint32
from meshpilot.networking.route_hashing import (
    LookupHash,
    destination_consistent_hash,
    hash_policy,
    service_consistent_hash,
)
from meshpilot.networking.route_retries import retry_policy
from meshpilot.networking.route_shared_hosts import default_hosts

MAX_DIRECT_RESPONSE_BODY = 1048576


def virtual_host_domains(svc: Service, proxy: Proxy) -> tuple[list[str], list[str]]:
    """(domains, expanded short names) of a service's virtual host; ports are not appended."""
    return vhosts_py.virtual_host_domains(svc, proxy.dns_domain)


def default_route(cluster: str, operation: str, mesh: Any) -> Any:
    route = rc.Route(
        name="default",
        match=rc.RouteMatch(prefix="/"),
        decorator=rc.Decorator(operation=operation),
    )
    route.route.cluster = cluster
    route.route.timeout.CopyFrom(duration(0))
    route.route.max_grpc_timeout.CopyFrom(duration(0))
    policy = retry_policy(
        mesh.default_http_retry_policy if mesh.HasField("default_http_retry_policy") else None
    )
    if policy is not None:
        route.route.retry_policy.CopyFrom(policy)
    return route


def _catch_all_cluster(proxy: Proxy, port: int) -> str:
    """PassthroughCluster, or the Sidecar's egressProxy as a route destination on ``port``."""
    scope = proxy.sidecar_scope
    egress = scope.egress_proxy if scope is not None else None
    if scope is None or egress is None or not egress.host:
        return names.PASSTHROUGH_CLUSTER
    return destination_cluster(egress, scope.service(egress.host), port)


def _catch_all_key(proxy: Proxy, port: int) -> tuple[object, bytes, int] | None:
    """What the catch-all host depends on: the outbound policy and, when set, the egressProxy."""
    scope = proxy.sidecar_scope
    if scope is None:
        return None
    egress = scope.egress_proxy
    if egress is None or not egress.host:
        return (scope.outbound_traffic_policy, b"", 0)
    return (scope.outbound_traffic_policy, egress.SerializeToString(deterministic=True), port)


def catch_all_virtual_host(proxy: Proxy, port: int = 0) -> Any:
    scope = proxy.sidecar_scope
    if scope is not None and scope.outbound_traffic_policy == REGISTRY_ONLY:
        route = rc.Route(name=names.BLOCK_ALL_VHOST, match=rc.RouteMatch(prefix="/"))
        route.direct_response.status = 502
        return rc.VirtualHost(
            name=names.BLOCK_ALL_VHOST, domains=["*"], routes=[route], include_request_attempt_count=True
        )
    route = rc.Route(name=names.ALLOW_ANY_VHOST, match=rc.RouteMatch(prefix="/"))
    route.route.cluster = _catch_all_cluster(proxy, port)
    route.route.timeout.CopyFrom(duration(0))
    route.route.max_grpc_timeout.CopyFrom(duration(0))
    return rc.VirtualHost(
        name=names.ALLOW_ANY_VHOST, domains=["*"], routes=[route], include_request_attempt_count=True
    )


def hosts_for_virtual_service(
    vs: VirtualServiceEntry, services: dict[str, Service]
) -> tuple[list[str], list[Service]]:
    """(VirtualService hosts outside the registry, registry services the VirtualService covers)."""
    outside: list[str] = []
    matched: list[Service] = []
    for host in vs.hosts:
        host = host.lower()
        if not is_wildcard(host):
            if host in services:
                matched.append(services[host])
            else:
                outside.append(host)
            continue
        found = [svc for name, svc in services.items() if host_matches(name, host)]
        if not found:
            outside.append(host)
        matched.extend(found)
    return outside, matched


@dataclass(frozen=True, slots=True)
class RouteCacheParts:
    """What a route configuration depends on through the proxy's scope."""

    fingerprint: int
    dependencies: frozenset[ConfigKey]
    #: VirtualServices match on the caller's labels or namespace, so those are key inputs too.
    source_sensitive: bool


def route_cache_parts(scope: SidecarScope, name: str, domain_suffix: str) -> RouteCacheParts | None:
    """The scope's share of the cache key of route ``name``; None for names meshpilot does not serve."""
    memo_key = ("route", name)
    if memo_key in scope.memo:
        return scope.memo[memo_key]  # type: ignore[return-value]
    port, _ = parse_route_name(name)
    parts = None
    listener = scope.egress_listener_for_port(port) if port is not None else None
    if listener is not None:
        services = [s for s in listener.services if s.port(port or 0) is not None]
        services.sort(key=lambda s: s.hostname)
        dependencies = {ConfigKey(Kind.SERVICE_ENTRY, s.hostname, s.namespace) for s in services}
        vs_parts = []
        destinations: set[str] = set()
        source_sensitive = False
        for vs in listener.virtual_services:
            dependencies.add(vs.config.key)
            # Destinations are looked up in the scope (for their ports), on any port.
            targets = []
            for host in _destination_hosts(vs.config, domain_suffix):
                target = scope.service(host)
                destinations.add(host)
                if target is not None:
                    dependencies.add(ConfigKey(Kind.SERVICE_ENTRY, target.hostname, target.namespace))
                    targets.append(target.fingerprint)
            vs_parts.append((str(vs.config.key), vs.config.spec_hash, targets))
            source_sensitive = source_sensitive or _matches_source(vs.config.spec)
        # Route hash policies come from the DestinationRules of the services
        # and destinations: their rules are inputs, and a change evicts.
        hashed = []
        hashing = _hashing_rules(scope)
        wanted = {s.hostname.lower() for s in services} | {d.lower() for d in destinations}
        for host in sorted(wanted & hashing.keys()):
            rule = hashing[host]
            hashed.append(rule.fingerprint)
            dependencies.update(c.key for c in rule.configs)
        fingerprint = hash_value(
            (
                [s.fingerprint for s in services],
                vs_parts,
                scope.outbound_traffic_policy,
                scope.egress_proxy.SerializeToString(deterministic=True) if scope.egress_proxy else b"",
                hashed,
            )
        )
        parts = RouteCacheParts(fingerprint, frozenset(dependencies), source_sensitive)
    scope.memo[memo_key] = parts
    return parts


def route_parts_signature(scope: SidecarScope) -> Hashable:
    """All ``route_cache_parts`` reads of a scope, to share its answers between scopes: the egress
    listeners' services and VirtualServices, the imports (destinations resolve there, DestinationRules
    hash) and the outbound policy. A Sidecar's scope is its own (an egress proxy, ports of its own)."""
    if scope.config is not None:
        return ("sidecar", id(scope))
    return (
        scope.import_signature(),
        tuple((e.port, tuple(map(id, e.services)), tuple(map(id, e.virtual_services))) for e in scope.egress),
        scope.outbound_traffic_policy,
    )


def _has_consistent_hash(rule: MergedDestinationRule) -> bool:
    """Whether any policy of the rule (top, port, subset, subset port) hashes."""
    policies = [rule.traffic_policy] + [
        s.traffic_policy for s in rule.subsets if s.HasField("traffic_policy")
    ]
    for policy in policies:
        if policy is None:
            continue
        balancers = [policy.load_balancer] + [p.load_balancer for p in policy.port_level_settings]
        if any(lb.HasField("consistent_hash") for lb in balancers):
            return True
    return False


def _destination_hosts(vs: Config, domain_suffix: str) -> list[str]:
    spec: Any = vs.spec
    hosts = [d.destination.host for http in spec.http for d in http.route]
    hosts += [http.mirror.host for http in spec.http if http.HasField("mirror")]
    hosts += [m.destination.host for http in spec.http for m in http.mirrors]
    # Short names resolve in the VirtualService's namespace, as the route builder resolves them.
    return sorted({resolve_short_name(h, vs.namespace, domain_suffix) for h in hosts})


def _matches_source(vs: Any) -> bool:
    return any(m.source_labels or m.source_namespace or m.gateways for http in vs.http for m in http.match)


def route_cache_key(proxy: Proxy, push: PushContext, name: str, parts: RouteCacheParts) -> int:
    """Everything build_route_configuration reads for this proxy and route name."""
    source = (proxy.labels, proxy.metadata.namespace) if parts.source_sensitive else None
    return hash_value((name, parts.fingerprint, proxy.dns_domain, source, push.mesh_fingerprint))


@dataclass
class _RouteTable:
    """One port's route configuration being built: virtual hosts so far and what they took."""

    port: int
    #: Services on the port by lowercased hostname (the last of a hostname wins), and their port.
    services: dict[str, Service]
    ports: dict[str, Port]
    known: set[str]
    seen_names: set[str] = dataclasses.field(default_factory=set)
    seen_domains: set[str] = dataclasses.field(default_factory=set)
    #: Hostnames a VirtualService routes; they get no default virtual host.
    covered: set[str] = dataclasses.field(default_factory=set)
    vhosts: list[Any] = dataclasses.field(default_factory=list)

    def add(self, name: str, domains: list[str], expanded: list[str], routes: list[Any]) -> None:
        if name in self.seen_names:
            return
        self.seen_names.add(name)
        kept = vhosts_py.keep_domains(domains, expanded, self.known, self.seen_domains)
        if kept:
            self.vhosts.append(
                rc.VirtualHost(name=name, domains=kept, routes=routes, include_request_attempt_count=True)
            )

    def is_http(self, svc: Service) -> bool:
        return _http_or_sniffed(self.ports[svc.hostname.lower()].protocol)


def route_header(name: str) -> Any:
    return route_pb2.RouteConfiguration(
        name=name,
        validate_clusters=boolean(False),
        max_direct_response_body_size_bytes=uint32(MAX_DIRECT_RESPONSE_BODY),
        ignore_port_in_host_matching=True,
    )


def _virtual_service_hosts(proxy: Proxy, push: PushContext, port: int, listener: Any) -> _RouteTable:
    """The table with the virtual hosts of the VirtualServices on ``port``, in istiod's order."""
    services, ports, known = _services_on_port(push, listener, port)
    table = _RouteTable(port, services, ports, known)
    virtual_services = list(listener.virtual_services)
    if port != 80:
        virtual_services = [vs for vs in virtual_services if hosts_for_virtual_service(vs, services)[1]]
    scope = proxy.sidecar_scope
    assert scope is not None
    for vs in virtual_services:
        routes = virtual_service_routes(proxy, push, vs.config, port)
        if not routes:
            continue
        outside, matched = hosts_for_virtual_service(vs, services)
        http_matched = [s for s in matched if table.is_http(s)]
        table.covered.update(s.hostname for s in matched)
        if http_matched or port == 80:
            for host in outside:
                table.add(f"{host}:{port}", [host], [], routes)
        for svc in http_matched:
            domains, expanded = virtual_host_domains(svc, proxy)
            table.add(f"{svc.hostname}:{port}", domains, expanded, routes)
    # Services a DestinationRule hashes get their default host with a hash
    # policy here, as protobuf; the wire-encoded default hosts carry none.
    for hostname, rule in _hashing_rules(scope).items():
        hashed = services.get(hostname)
        if hashed is None or hashed.hostname in table.covered or hashed.resolution is Resolution.ALIAS:
            continue
        policy = hash_policy(service_consistent_hash(rule, port)) if table.is_http(hashed) else None
        if policy is None:
            continue
        route = default_route(
            names.outbound_cluster(port, "", hashed.hostname), f"{hashed.hostname}:{port}/*", push.mesh
        )
        route.route.hash_policy.append(policy)
        table.covered.add(hashed.hostname)
        domains, expanded = virtual_host_domains(hashed, proxy)
        table.add(f"{hashed.hostname}:{port}", domains, expanded, [route])
    return table


def _services_on_port(
    push: PushContext, listener: Any, port: int
) -> tuple[dict[str, Service], dict[str, Port], set[str]]:
    """``vhosts.services_on_port`` for an egress listener, once per snapshot for the scopes that import
    the same services in the same order: the same objects then let them share default hosts too. The
    key names the services by identity, not the list: a namespace with DestinationRules of its own
    builds its scope's list itself (``sidecar_scope``), with the same services as the others'."""
    imported = listener.services
    entry: tuple[Any, tuple[dict[str, Service], dict[str, Port], set[str]]] = push.memoized(
        # The entry holds the first caller's services, so their ids stay theirs while it lives.
        ("services-on-port", tuple(map(id, imported)), port),
        lambda: (imported, vhosts.services_on_port(imported, port)),
    )
    return entry[1]


def _hashing_rules(scope: SidecarScope) -> dict[str, MergedDestinationRule]:
    """The scope's DestinationRules that hash, by lowercased host: usually none, so services cost nothing."""
    found = scope.memo.get("hashing-rules")
    if found is None:
        found = {
            host.lower(): rule
            for host, rule in scope.destination_rules.items()
            if rule is not None and _has_consistent_hash(rule)
        }
        scope.memo["hashing-rules"] = found
    return found  # type: ignore[return-value]


def virtual_service_routes(
    proxy: Proxy, push: PushContext, vs: Config, port: int, gateway: GatewayRef | None = None
) -> list[Any]:
    """A VirtualService's HTTP routes on ``port`` as the proxy's scope resolves them (for a sidecar,
    or on ``gateway``)."""
    scope = proxy.sidecar_scope
    assert scope is not None
    lookup_hash = _hash_lookup(scope, vs.namespace, push.domain_suffix)
    return routes_for_virtual_service(
        proxy, vs, port, scope.service, push.mesh, push.domain_suffix, lookup_hash, gateway
    )


def _hash_lookup(scope: SidecarScope, namespace: str, domain_suffix: str) -> LookupHash:
    """Consistent hashes of a VirtualService's destinations, from the DestinationRules in scope."""

    def lookup(destination: Any) -> Any | None:
        host = resolve_short_name(destination.destination.host, namespace, domain_suffix)
        return destination_consistent_hash(scope.destination_rule(host), destination.destination)

    return lookup


def _listener_for(proxy: Proxy, name: str) -> tuple[int, bool, Any] | None:
    port, sniffed = parse_route_name(name)
    scope = proxy.sidecar_scope
    if port is None or scope is None:
        return None
    listener = scope.egress_listener_for_port(port)
    return (port, sniffed, listener) if listener is not None else None


def build_route_configuration(proxy: Proxy, push: PushContext, name: str) -> Any:
    """The RouteConfiguration a sidecar's listener asked for by name, as protobuf objects."""
    out = route_header(name)
    found = _listener_for(proxy, name)
    if found is None:
        return out
    port, sniffed, listener = found
    table = _virtual_service_hosts(proxy, push, port, listener)
    for svc in table.services.values():
        if svc.hostname in table.covered or svc.resolution is Resolution.ALIAS or not table.is_http(svc):
            continue
        cluster = names.outbound_cluster(port, "", svc.hostname)
        route = default_route(cluster, f"{svc.hostname}:{port}/*", push.mesh)
        domains, expanded = virtual_host_domains(svc, proxy)
        table.add(f"{svc.hostname}:{port}", domains, expanded, [route])
    vhosts = table.vhosts
    if sniffed:
        host = name.rpartition(":")[0]
        chosen = [v for v in vhosts if name in v.domains or host in v.domains]
        if len(chosen) == 1:
            del chosen[0].domains[:]
            chosen[0].domains.append("*")
        out.virtual_hosts.extend(sorted(chosen, key=lambda v: v.name))
        return out
    out.virtual_hosts.extend(sorted(vhosts, key=lambda v: v.name))
    out.virtual_hosts.append(catch_all_virtual_host(proxy, port))
    return out


# The protocols whose services get virtual hosts (sniffed ones too).
_HTTP_PROTOCOLS = tuple(p for p in Protocol if p.is_http or p is Protocol.UNSUPPORTED)


def encode_route_configuration(proxy: Proxy, push: PushContext, name: str) -> bytes:
    """The same RouteConfiguration, serialized; default virtual hosts are wire-encoded.

    VirtualService hosts are built as protobuf objects (they are few); the
    default host of every other service is encoded by ``vhosts``. A sniffed
    listener's route (one host) takes the protobuf path whole.
    """
    found = _listener_for(proxy, name)
    if found is None or found[1]:
        return serialize(build_route_configuration(proxy, push, name))
    port, _, listener = found
    table = _virtual_service_hosts(proxy, push, port, listener)
    template = push.memoized(("route-template",), lambda: serialize(default_route("", "", push.mesh)))
    encoded = default_hosts(
        push,
        table.services,
        port,
        proxy.dns_domain,
        _HTTP_PROTOCOLS,
        table.covered,
        table.known,
        table.seen_names,
        table.seen_domains,
        template,
    )
    encoded.extend((v.name, serialize(v)) for v in table.vhosts)
    encoded.sort(key=_BY_NAME)
    header = push.memoized(("route-header", name), lambda: serialize(route_header(name)))
    catch_all = push.memoized(
        ("route-catch-all", _catch_all_key(proxy, port)),
        lambda: serialize(catch_all_virtual_host(proxy, port)),
    )
    return vhosts.route_configuration(header, list(map(_BODY, encoded)), catch_all)


# C-level accessors: a Python function or comprehension here would run per virtual host.
_BY_NAME = itemgetter(0)
_BODY = itemgetter(1)


def _http_or_sniffed(protocol: Protocol) -> bool:
    return protocol.is_http or protocol is Protocol.UNSUPPORTED


def parse_route_name(name: str) -> tuple[int | None, bool]:
    """(listener port, sniffed) of a route name; (None, False) for names meshpilot does not serve."""
    if name.isdigit():
        return int(name), False
    host, sep, port = name.rpartition(":")
    if sep and host and port.isdigit() and not name.startswith("unix://"):
        return int(port), True
    return None, False
