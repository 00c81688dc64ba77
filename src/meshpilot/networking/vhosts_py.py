"""Default virtual hosts of a route configuration, wire-encoded (pure-Python twin).

Most virtual hosts of a sidecar's port route (``"8080"``) are the default one
of a service no VirtualService covers: its domains and one ``default`` route
to its cluster. ``ext/vhosts.pyx`` is the compiled twin; both make the same
bytes, and tests check that the route configuration they end up in parses
into exactly what ``route.build_route_configuration`` makes.

Encodings, by field number:

- ``VirtualHost``: name 1, domains 2, routes 3, include_request_attempt_count 14.
- ``Route``: a template (match, name and the route action's fixed parts, serialized
  once per MeshConfig), then route 2 ``{cluster 1}`` and decorator 5 ``{operation 1}``,
  which a parser merges into the template's fields of the same numbers.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Iterable

from meshpilot.model.service import Port, Registry, Resolution, Service
from meshpilot.networking.wire_py import _len, varint

_SVC = ".svc."


def _is_ip(text: str) -> bool:
    # Only digits and dots, or a colon, can be an address; the parse settles the rest.
    if ":" not in text and not text.replace(".", "").isdigit():
        return False
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def kube_domain(proxy_domain: str) -> tuple[str, str] | None:
    """(namespace, ``.svc.<suffix>``) of a Kubernetes proxy domain; None for any other domain."""
    if _SVC not in proxy_domain:
        return None
    at = proxy_domain.index(_SVC)
    return proxy_domain[:at], proxy_domain[at:]


def named_namespace(hostname: str, svc_suffix: str) -> str | None:
    """The namespace a ``<name>.<namespace>.svc.<suffix>`` hostname names, where short forms apply;
    the proxies of that namespace also call it by its bare name."""
    if not hostname.endswith(svc_suffix):
        return None
    svc_at = hostname.find(_SVC)
    if svc_at <= 0:
        return None
    dot = hostname.index(".")
    if dot + 1 > svc_at:
        return None
    return hostname[dot + 1 : svc_at]


def alt_hosts(hostname: str, proxy_domain: str) -> list[str]:
    """Other names a client may use for ``hostname``: ``host.``, and short forms in Kubernetes."""
    out = [] if _is_ip(hostname) else [hostname + "."]
    kube = kube_domain(proxy_domain)
    if kube is not None:
        namespace, svc_suffix = kube
        named = named_namespace(hostname, svc_suffix)
        if named is None:
            return out
        svc_at = hostname.find(_SVC)
        if named == namespace:
            return [*out, hostname[: hostname.index(".")], hostname[:svc_at] + ".svc", hostname[:svc_at]]
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


def virtual_host_domains(svc: Service, proxy_domain: str) -> tuple[list[str], list[str]]:
    """(domains, expanded short names) of a service's virtual host; ports are not appended."""
    expanded = alt_hosts(svc.hostname, proxy_domain)
    domains = [svc.hostname, *expanded]
    if svc.resolution is Resolution.PASSTHROUGH and svc.registry is Registry.KUBERNETES:
        domains += ["*." + d for d in domains]
    for address in svc.addresses:
        if address and address != "0.0.0.0":
            domains.append(f"[{address}]" if ":" in address else address)
    return domains, expanded


def keep_domains(
    domains: Iterable[str], expanded: Collection[str], known: Collection[str], seen_domains: set[str]
) -> list[str]:
    """The domains no earlier virtual host took, without short names that are another service's name."""
    kept = []
    for domain in domains:
        lowered = domain.lower()
        if lowered in seen_domains or (domain in expanded and domain in known):
            continue
        kept.append(domain)
        seen_domains.add(lowered)
    return kept


def services_on_port(
    services: Iterable[Service], port: int
) -> tuple[dict[str, Service], dict[str, Port], set[str]]:
    """Services with ``port`` by lowercased hostname (the last wins), their port, and the
    names they answer to (hostname, ``hostname:port``)."""
    by_host: dict[str, Service] = {}
    ports: dict[str, Port] = {}
    known: set[str] = set()
    suffix = f":{port}"
    for svc in services:
        for candidate in svc.ports:
            if candidate.port == port:
                key = svc.hostname.lower()
                by_host[key] = svc
                ports[key] = candidate
                break
    for svc in by_host.values():
        known.add(svc.hostname)
        known.add(svc.hostname + suffix)
    return by_host, ports, known


def default_virtual_hosts(
    services: Iterable[Service],
    port: int,
    proxy_domain: str,
    http_protocols: Collection[object],
    covered: Collection[str],
    known: Collection[str],
    seen_names: set[str],
    seen_domains: set[str],
    route_template: bytes,
) -> list[tuple[str, bytes]]:
    """(name, serialized VirtualHost) of each service on ``port`` that gets the default route.

    Services not on the port, of a protocol not in ``http_protocols``, ALIAS
    services and those in ``covered`` (by a VirtualService) get none; names
    and domains already in ``seen_names``/``seen_domains`` are skipped, and
    both sets are updated, as the route builder does for the hosts before.
    """
    out = []
    for svc in services:
        matching = None
        for candidate in svc.ports:
            if candidate.port == port:
                matching = candidate
                break
        if matching is None or matching.protocol not in http_protocols:
            continue
        if svc.hostname in covered or svc.resolution is Resolution.ALIAS:
            continue
        name = f"{svc.hostname}:{port}"
        if name in seen_names:
            continue
        seen_names.add(name)
        domains, expanded = virtual_host_domains(svc, proxy_domain)
        kept = keep_domains(domains, expanded, known, seen_domains)
        if not kept:
            continue
        cluster = f"outbound|{port}||{svc.hostname}"
        route = route_template + _len(2, _len(1, cluster.encode())) + _len(5, _len(1, f"{name}/*".encode()))
        body = _len(1, name.encode())
        body += b"".join(_len(2, d.encode()) for d in kept)
        body += _len(3, route) + varint(14 << 3) + b"\x01"
        out.append((name, body))
    return out


def route_configuration(header: bytes, virtual_hosts: Iterable[bytes], catch_all: bytes) -> bytes:
    """A serialized RouteConfiguration: its fixed fields, then the virtual hosts in order."""
    return header + b"".join(_len(2, v) for v in virtual_hosts) + _len(2, catch_all)
