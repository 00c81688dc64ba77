"""Route configurations of a sidecar (RDS): virtual hosts per service and VirtualService.

A route name is either a port (``"9080"``: every HTTP service on the port) or
``"<fqdn>:<port>"`` for a sniffed listener on a service VIP, which gets only
that service's virtual host.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from dataclasses import dataclass
from typing import Any

from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.config.route.v3 import route_pb2

from meshpilot.model.config import Config, ConfigKey
from meshpilot.model.confighash import hash_value
from meshpilot.model.hosts import host_matches, is_wildcard, resolve_short_name
from meshpilot.model.kind import Kind
from meshpilot.model.mesh import REGISTRY_ONLY
from meshpilot.model.protocol import Protocol
from meshpilot.model.proxy import Proxy
from meshpilot.model.push_context import PushContext, VirtualServiceEntry
from meshpilot.model.service import Registry, Resolution, Service
from meshpilot.model.sidecar_scope import SidecarScope
from meshpilot.networking import names
from meshpilot.networking.http_routes import retry_policy, routes_for_virtual_service
from meshpilot.networking.protobuf import boolean, duration, uint32

MAX_DIRECT_RESPONSE_BODY = 1048576


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def alt_hosts(hostname: str, proxy_domain: str) -> list[str]:
    """Other names a client may use for ``hostname``: ``host.``, and short forms in Kubernetes."""
    out = [] if _is_ip(hostname) else [hostname + "."]
    if ".svc." in proxy_domain:
        if not hostname.endswith(proxy_domain[proxy_domain.index(".svc.") :]):
            return out
        svc_at = hostname.find(".svc.")
        if svc_at <= 0:
            return out
        dot = hostname.index(".")
        if dot + 1 > svc_at:
            return out
        if hostname[dot + 1 : svc_at] == proxy_domain[: proxy_domain.index(".svc.")]:
            return [*out, hostname[:dot], hostname[:svc_at] + ".svc", hostname[:svc_at]]
        return [*out, hostname[:svc_at], hostname[:svc_at] + ".svc"]
    host_parts, domain_parts = hostname.split("."), proxy_domain.split(".")
    shared = 0
    while (
        shared < min(len(host_parts), len(domain_parts))
        and host_parts[-1 - shared] == domain_parts[-1 - shared]
    ):
        shared += 1
    if shared == 0:
        return out
    unique = host_parts[: len(host_parts) - shared]
    out.append(".".join(unique))
    if len(unique) == 2:
        out.append(".".join(unique) + "." + host_parts[len(host_parts) - shared])
    return out


def virtual_host_domains(svc: Service, proxy: Proxy) -> tuple[list[str], list[str]]:
    """(domains, expanded short names) of a service's virtual host; ports are not appended."""
    expanded = alt_hosts(svc.hostname, proxy.dns_domain)
    domains = [svc.hostname, *expanded]
    if svc.resolution is Resolution.PASSTHROUGH and svc.registry is Registry.KUBERNETES:
        domains += ["*." + d for d in domains]
    for address in svc.addresses:
        if address and address != "0.0.0.0":
            domains.append(f"[{address}]" if ":" in address else address)
    return domains, expanded


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


def catch_all_virtual_host(proxy: Proxy) -> Any:
    scope = proxy.sidecar_scope
    if scope is not None and scope.outbound_traffic_policy == REGISTRY_ONLY:
        route = rc.Route(name=names.BLOCK_ALL_VHOST, match=rc.RouteMatch(prefix="/"))
        route.direct_response.status = 502
        return rc.VirtualHost(
            name=names.BLOCK_ALL_VHOST, domains=["*"], routes=[route], include_request_attempt_count=True
        )
    route = rc.Route(name=names.ALLOW_ANY_VHOST, match=rc.RouteMatch(prefix="/"))
    route.route.cluster = names.PASSTHROUGH_CLUSTER
    route.route.timeout.CopyFrom(duration(0))
    route.route.max_grpc_timeout.CopyFrom(duration(0))
    return rc.VirtualHost(
        name=names.ALLOW_ANY_VHOST, domains=["*"], routes=[route], include_request_attempt_count=True
    )


def _hosts_for_vs(vs: VirtualServiceEntry, services: dict[str, Service]) -> tuple[list[str], list[Service]]:
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
    port, _ = _parse_route_name(name)
    parts = None
    listener = scope.egress_listener_for_port(port) if port is not None else None
    if listener is not None:
        services = [s for s in listener.services if s.port(port or 0) is not None]
        services.sort(key=lambda s: s.hostname)
        dependencies = {ConfigKey(Kind.SERVICE_ENTRY, s.hostname, s.namespace) for s in services}
        vs_parts = []
        source_sensitive = False
        for vs in listener.virtual_services:
            dependencies.add(vs.config.key)
            # Destinations are looked up in the scope (for their ports), on any port.
            targets = []
            for host in _destination_hosts(vs.config, domain_suffix):
                target = scope.service(host)
                if target is not None:
                    dependencies.add(ConfigKey(Kind.SERVICE_ENTRY, target.hostname, target.namespace))
                    targets.append(target.fingerprint)
            vs_parts.append((str(vs.config.key), vs.config.spec_hash, targets))
            source_sensitive = source_sensitive or _matches_source(vs.config.spec)
        fingerprint = hash_value(([s.fingerprint for s in services], vs_parts, scope.outbound_traffic_policy))
        parts = RouteCacheParts(fingerprint, frozenset(dependencies), source_sensitive)
    scope.memo[memo_key] = parts
    return parts


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


def build_route_configuration(proxy: Proxy, push: PushContext, name: str) -> Any:
    """The RouteConfiguration a sidecar's listener asked for by name."""
    port, sniffed = _parse_route_name(name)
    out = route_pb2.RouteConfiguration(
        name=name,
        validate_clusters=boolean(False),
        max_direct_response_body_size_bytes=uint32(MAX_DIRECT_RESPONSE_BODY),
        ignore_port_in_host_matching=True,
    )
    scope = proxy.sidecar_scope
    if port is None or scope is None:
        return out
    listener = scope.egress_listener_for_port(port)
    if listener is None:
        return out
    services: dict[str, Service] = {}
    for svc in listener.services:
        matching = svc.port(port)
        if matching is not None:
            services[svc.hostname.lower()] = dataclasses.replace(svc, ports=(matching,))
    virtual_services = list(listener.virtual_services)
    if port != 80:
        virtual_services = [vs for vs in virtual_services if _hosts_for_vs(vs, services)[1]]

    def lookup(host: str) -> Service | None:
        return scope.service(host) if scope is not None else None

    vhosts: list[Any] = []
    seen_names: set[str] = set()
    seen_domains: set[str] = set()
    covered: set[str] = set()
    known = {n for svc in services.values() for n in (svc.hostname, f"{svc.hostname}:{port}")}

    def add_vhost(vhost_name: str, domains: list[str], expanded: list[str], routes: list[Any]) -> None:
        if vhost_name in seen_names:
            return
        seen_names.add(vhost_name)
        kept = []
        for domain in domains:
            lowered = domain.lower()
            if lowered in seen_domains or (domain in expanded and domain in known):
                continue
            kept.append(domain)
            seen_domains.add(lowered)
        if kept:
            vhosts.append(
                rc.VirtualHost(
                    name=vhost_name, domains=kept, routes=routes, include_request_attempt_count=True
                )
            )

    for vs in virtual_services:
        routes = routes_for_virtual_service(proxy, vs.config, port, lookup, push.mesh, push.domain_suffix)
        if not routes:
            continue
        outside, matched = _hosts_for_vs(vs, services)
        http_matched = [s for s in matched if _http_or_sniffed(s.ports[0].protocol)]
        covered.update(s.hostname for s in matched)
        if http_matched or port == 80:
            for host in outside:
                add_vhost(f"{host}:{port}", [host], [], routes)
        for svc in http_matched:
            domains, expanded = virtual_host_domains(svc, proxy)
            add_vhost(f"{svc.hostname}:{port}", domains, expanded, routes)
    for svc in services.values():
        if svc.hostname in covered or svc.resolution is Resolution.ALIAS:
            continue
        if not _http_or_sniffed(svc.ports[0].protocol):
            continue
        cluster = names.outbound_cluster(port, "", svc.hostname)
        route = default_route(cluster, f"{svc.hostname}:{port}/*", push.mesh)
        domains, expanded = virtual_host_domains(svc, proxy)
        add_vhost(f"{svc.hostname}:{port}", domains, expanded, [route])
    if sniffed:
        host = name.rpartition(":")[0]
        chosen = [v for v in vhosts if name in v.domains or host in v.domains]
        if len(chosen) == 1:
            del chosen[0].domains[:]
            chosen[0].domains.append("*")
        out.virtual_hosts.extend(sorted(chosen, key=lambda v: v.name))
        return out
    out.virtual_hosts.extend(sorted(vhosts, key=lambda v: v.name))
    out.virtual_hosts.append(catch_all_virtual_host(proxy))
    return out


def _http_or_sniffed(protocol: Protocol) -> bool:
    return protocol.is_http or protocol is Protocol.UNSUPPORTED


def _parse_route_name(name: str) -> tuple[int | None, bool]:
    """(listener port, sniffed) of a route name; (None, False) for names meshpilot does not serve."""
    if name.isdigit():
        return int(name), False
    host, sep, port = name.rpartition(":")
    if sep and host and port.isdigit() and not name.startswith("unix://"):
        return int(port), True
    return None, False
