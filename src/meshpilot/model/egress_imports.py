"""What one egress listener of a Sidecar imports: hosts by namespace, then services and VirtualServices.

The ``hosts`` of an egress listener (``ns/host``) select from the services and
VirtualServices visible to the config namespace, as istiod's
``convertToSidecarScope`` does (pilot/pkg/model/sidecar.go); the scope
(``sidecar_scope``) puts the listeners' choices together.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from meshpilot.model.config import Config
from meshpilot.model.hosts import host_matches, host_subset_of, is_wildcard, resolve_short_name
from meshpilot.model.protocol import Protocol
from meshpilot.model.service import Registry, Service

if TYPE_CHECKING:
    from meshpilot.model.push_context import VirtualServiceEntry

#: Sidecar CaptureMode enum numbers.
CAPTURE_DEFAULT = 0
CAPTURE_IPTABLES = 1
CAPTURE_NONE = 2

_WILDCARD_NAMESPACE = "*"
_CURRENT_NAMESPACE = "."


@dataclass(frozen=True, slots=True)
class HostImports:
    """The hosts one egress listener imports from one namespace (istiod's hostClassification)."""

    exact: frozenset[str]
    hosts: tuple[str, ...]

    @property
    def every_service(self) -> bool:
        """``*`` is among the hosts: every service of the namespace is imported."""
        return "*" in self.hosts

    def imports_service(self, hostname: str) -> bool:
        """A service is imported when its hostname lies within an imported host (``*.com`` has ``a.com``)."""
        if hostname in self.exact:
            return True
        return any(
            host_subset_of(hostname, imported)
            for imported in self.hosts
            if is_wildcard(hostname) or is_wildcard(imported)
        )

    def imports_virtual_service_host(self, host: str) -> bool:
        """A VirtualService host is imported when it overlaps an imported host, either way round."""
        if host in self.exact:
            return True
        wild = is_wildcard(host)
        return any(host_matches(host, imported) for imported in self.hosts if wild or is_wildcard(imported))


def parse_egress_hosts(hosts: Iterable[str], config_namespace: str) -> dict[str, HostImports]:
    """``ns/host`` entries grouped by namespace; ``.`` is the config namespace.

    Entries without exactly one slash are ignored, as istiod ignores them
    (validation rejects them first). ``~`` is kept as a namespace no service
    lives in, so ``~/*`` imports nothing.
    """
    exact: dict[str, set[str]] = {}
    every: dict[str, list[str]] = {}
    for text in hosts:
        if text.count("/") != 1:
            continue
        namespace, _, host = text.partition("/")
        if namespace == _CURRENT_NAMESPACE:
            namespace = config_namespace
        every.setdefault(namespace, []).append(host)
        exact.setdefault(namespace, set())
        if not is_wildcard(host):
            exact[namespace].add(host)
    return {ns: HostImports(frozenset(exact[ns]), tuple(hosts_)) for ns, hosts_ in every.items()}


@dataclass(frozen=True, slots=True, eq=False)
class EgressListener:
    """One egress listener of a Sidecar, with what it imports."""

    #: The Sidecar's port (number, protocol, name), or None for the catch-all listener.
    port: Any | None
    bind: str
    capture_mode: int
    #: What it imports, by namespace ("*" for any namespace).
    imports: Mapping[str, HostImports]
    services: tuple[Service, ...] = ()
    virtual_services: tuple[VirtualServiceEntry, ...] = ()

    @property
    def matches_port(self) -> bool:
        """Services are cut to the listener's port, except on a catch-all or HTTP_PROXY listener."""
        return (
            self.port is not None
            and self.port.number != 0
            and Protocol.parse(self.port.protocol) is not Protocol.HTTP_PROXY
        )


def egress_specs(sidecar: Config | None) -> list[tuple[Any | None, str, int, list[str]]]:
    default: list[tuple[Any | None, str, int, list[str]]] = [(None, "", CAPTURE_DEFAULT, ["*/*"])]
    if sidecar is None:
        return default
    return [
        (e.port if e.HasField("port") else None, e.bind, e.capture_mode, list(e.hosts))
        for e in sidecar.spec.egress
    ] or default


def matching_port(svc: Service, listener: EgressListener) -> Service | None:
    if not listener.matches_port or listener.port is None:
        return svc
    port = svc.port(listener.port.number)
    if port is None:
        return None
    return svc if len(svc.ports) == 1 else dataclasses.replace(svc, ports=(port,))


def select_services(
    services: list[Service], listener: EgressListener, config_namespace: str
) -> tuple[Service, ...]:
    """Visible services the listener's hosts import, one namespace per hostname."""
    imports = listener.imports
    wildcard = imports.get(_WILDCARD_NAMESPACE)
    chosen: list[Service] = []
    if wildcard is not None and wildcard.every_service and not listener.matches_port:
        # ``*/*`` on a listener of every port (every namespace's default scope): all of them, as
        # they are; asking each service the questions below was most of building such a scope.
        chosen = list(services)
    else:
        for svc in services:
            hosts = (imports.get(svc.namespace), wildcard)
            if any(h is not None and h.imports_service(svc.hostname) for h in hosts):
                found = matching_port(svc, listener)
                if found is not None:
                    chosen.append(found)
    # One namespace per hostname: the config namespace wins; otherwise the
    # first seen, unless a Kubernetes service comes later (a ServiceEntry may
    # not squat on a Kubernetes hostname).
    owner: dict[str, tuple[str, bool]] = {}
    for svc in chosen:
        candidate = (svc.namespace, svc.registry is Registry.KUBERNETES)
        current = owner.get(svc.hostname)
        displaces = current is not None and (
            svc.namespace == config_namespace
            or (not current[1] and candidate[1] and current[0] != config_namespace)
        )
        if current is None or displaces:
            owner[svc.hostname] = candidate
    out: list[Service] = []
    seen: set[tuple[str, str]] = set()
    for svc in chosen:
        key = (svc.hostname, svc.namespace)
        if owner[svc.hostname][0] == svc.namespace and key not in seen:
            seen.add(key)
            out.append(svc)
    return tuple(out)


def select_virtual_services(
    entries: list[VirtualServiceEntry], listener: EgressListener
) -> tuple[VirtualServiceEntry, ...]:
    """VirtualServices with a host the listener imports from the VirtualService's namespace or ``*``."""
    imports = listener.imports
    wildcard = imports.get(_WILDCARD_NAMESPACE)
    out = []
    for vs in entries:
        candidates = [h for h in (imports.get(vs.config.namespace), wildcard) if h is not None]
        if any(c.imports_virtual_service_host(host) for c in candidates for host in vs.hosts):
            out.append(vs)
    return tuple(out)


def virtual_service_destinations(
    vs: Config, config_namespace: str, domain_suffix: str
) -> dict[str, set[int]]:
    """Hosts a VirtualService sends traffic to, with their ports (0: no port given).

    HTTP routes whose matches all name another source namespace are left out:
    they never apply to proxies of ``config_namespace``.
    """
    spec = vs.spec
    out: dict[str, set[int]] = {}

    def add(destination: Any) -> None:
        host = resolve_short_name(destination.host, vs.namespace, domain_suffix)
        port = destination.port.number if destination.HasField("port") else 0
        out.setdefault(host, set()).add(port)

    for http in spec.http:
        applies = True
        for match in http.match:
            if match.source_namespace:
                if match.source_namespace == config_namespace:
                    applies = True
                    break
                applies = False
        if not applies:
            continue
        for route in http.route:
            if route.HasField("destination"):
                add(route.destination)
        if http.HasField("mirror"):
            add(http.mirror)
        for mirror in http.mirrors:
            if mirror.HasField("destination"):
                add(mirror.destination)
    for routes in (spec.tcp, spec.tls):
        for rule in routes:
            for route in rule.route:
                if route.HasField("destination"):
                    add(route.destination)
    return out


def matching_destination_ports(svc: Service, ports: set[int]) -> Service | None:
    if not ports or 0 in ports:
        return svc
    found = tuple(p for p in svc.ports if p.port in ports)
    if len(found) == len(svc.ports):
        return svc
    return dataclasses.replace(svc, ports=found) if found else None
