"""SidecarScope: what one sidecar sees, from its Sidecar resource or the defaults.

A scope lists, per egress listener, the services and VirtualServices a proxy
imports, and the config keys it depends on, so a change outside the scope
does not push to the proxy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from meshpilot.model.config import Config, ConfigKey
from meshpilot.model.destination_rules import MergedDestinationRule
from meshpilot.model.hosts import host_matches
from meshpilot.model.kind import Kind
from meshpilot.model.service import Resolution, Service

if TYPE_CHECKING:
    from meshpilot.model.push_context import PushContext, VirtualServiceEntry

#: Sidecar CaptureMode enum numbers.
CAPTURE_DEFAULT = 0
CAPTURE_IPTABLES = 1
CAPTURE_NONE = 2

DEFAULT_SCOPE_NAME = "default-sidecar"
#: Kinds whose relevance the scope can decide; others always concern a proxy.
SCOPED_KINDS = frozenset({Kind.SERVICE_ENTRY, Kind.VIRTUAL_SERVICE, Kind.DESTINATION_RULE, Kind.SIDECAR})
#: Kinds that concern a proxy only in its own namespace or the root namespace.
NAMESPACED_POLICY_KINDS = frozenset(
    {Kind.PEER_AUTHENTICATION, Kind.AUTHORIZATION_POLICY, Kind.REQUEST_AUTHENTICATION, Kind.ENVOY_FILTER}
)


@dataclass(frozen=True, slots=True)
class EgressListener:
    """One egress listener of a Sidecar, with what it imports."""

    #: The Sidecar's port (number, protocol, name), or None for the catch-all listener.
    port: Any | None
    bind: str
    capture_mode: int
    #: (namespace, host) pairs; namespace "*" means any.
    hosts: tuple[tuple[str, str], ...]
    services: tuple[Service, ...] = ()
    virtual_services: tuple[VirtualServiceEntry, ...] = ()


@dataclass(slots=True)
class SidecarScope:
    name: str
    namespace: str
    config: Config | None
    egress: tuple[EgressListener, ...]
    ingress: tuple[Any, ...]
    #: MeshConfig.OutboundTrafficPolicy.Mode number (REGISTRY_ONLY=0, ALLOW_ANY=1).
    outbound_traffic_policy: int
    services: list[Service] = field(default_factory=list)
    destination_rules: dict[str, MergedDestinationRule | None] = field(default_factory=dict)
    dependencies: frozenset[ConfigKey] = frozenset()
    _by_host: dict[str, Service] = field(default_factory=dict)
    #: Values derived from the scope (cache key parts), computed once per snapshot.
    memo: dict[object, object] = field(default_factory=dict)

    def service(self, hostname: str) -> Service | None:
        return self._by_host.get(hostname)

    def destination_rule(self, hostname: str) -> MergedDestinationRule | None:
        return self.destination_rules.get(hostname)

    def depends_on(self, key: ConfigKey, root_namespace: str) -> bool:
        """Whether a change to ``key`` can change this scope's proxies' config."""
        if key.kind in NAMESPACED_POLICY_KINDS:
            return key.namespace in (self.namespace, root_namespace)
        if key.kind not in SCOPED_KINDS:
            return True
        return key in self.dependencies

    @property
    def has_headless(self) -> bool:
        """Whether any imported service is headless (its listeners follow its endpoints)."""
        found = self.memo.get("has_headless")
        if found is None:
            found = self.memo["has_headless"] = any(s.is_headless for s in self.services)
        return bool(found)

    @property
    def has_dns(self) -> bool:
        """Whether any imported service resolves by DNS (its clusters carry endpoints)."""
        found = self.memo.get("has_dns")
        if found is None:
            dns = (Resolution.DNS_LB, Resolution.DNS_ROUND_ROBIN_LB)
            found = self.memo["has_dns"] = any(s.resolution in dns for s in self.services)
        return bool(found)

    def egress_listener_for_port(self, port: int) -> EgressListener | None:
        """The first listener with this port, or the catch-all one."""
        for listener in self.egress:
            if listener.port is None or listener.port.number == port:
                return listener
        return None

    @property
    def has_ingress(self) -> bool:
        return bool(self.ingress)


def _parse_hosts(hosts: list[str], config_namespace: str) -> tuple[tuple[str, str], ...]:
    out = []
    for text in hosts:
        namespace, _, host = text.partition("/")
        if namespace == ".":
            namespace = config_namespace
        out.append((namespace, host))
    return tuple(out)


def _selects(hosts: tuple[tuple[str, str], ...], namespace: str, hostname: str) -> bool:
    return any(ns != "~" and (ns in ("*", namespace)) and host_matches(host, hostname) for ns, host in hosts)


def build_scope(push: PushContext, namespace: str, sidecar: Config | None) -> SidecarScope:
    """The scope of proxies in ``namespace`` selected by ``sidecar`` (None: the default)."""
    mesh_policy = push.mesh.outbound_traffic_policy.mode
    if sidecar is None:
        raw_egress: list[tuple[Any | None, str, int, list[str]]] = [(None, "", CAPTURE_DEFAULT, ["*/*"])]
        ingress: tuple[Any, ...] = ()
        policy = mesh_policy
        name = DEFAULT_SCOPE_NAME
    else:
        spec = sidecar.spec
        raw_egress = [
            (e.port if e.HasField("port") else None, e.bind, e.capture_mode, list(e.hosts))
            for e in spec.egress
        ] or [(None, "", CAPTURE_DEFAULT, ["*/*"])]
        ingress = tuple(spec.ingress)
        policy = (
            spec.outbound_traffic_policy.mode if spec.HasField("outbound_traffic_policy") else mesh_policy
        )
        name = sidecar.name

    visible_services = push.services_visible_to(namespace)
    visible_vs = push.virtual_services_visible_to(namespace)
    egress = []
    for port, bind, capture, hosts_text in raw_egress:
        hosts = _parse_hosts(hosts_text, namespace)
        chosen: dict[str, Service] = {}
        for svc in visible_services:
            if not _selects(hosts, svc.namespace, svc.hostname):
                continue
            current = chosen.get(svc.hostname)
            # One service per hostname: the proxy's own namespace wins, then the oldest.
            if current is None or (svc.namespace == namespace and current.namespace != namespace):
                chosen[svc.hostname] = svc
        services = []
        for svc in chosen.values():
            if port is not None:
                matching = svc.port(port.number)
                if matching is None:
                    continue
                svc = dataclasses.replace(svc, ports=(matching,))
            services.append(svc)
        vses = tuple(
            vs for vs in visible_vs if any(_selects(hosts, vs.config.namespace, h) for h in vs.hosts)
        )
        egress.append(EgressListener(port, bind, capture, hosts, tuple(services), vses))

    scope = SidecarScope(name, namespace, sidecar, tuple(egress), ingress, policy)
    deps: set[ConfigKey] = set()
    if sidecar is not None:
        deps.add(sidecar.key)
    # The scope's services are the union over listeners; a service imported by
    # several listeners keeps the union of the ports they import.
    ports_by_host: dict[str, set[int]] = {}
    originals: dict[str, Service] = {}
    for listener in scope.egress:
        for svc in listener.services:
            if svc.hostname not in originals:
                original = push.service(svc.hostname, svc.namespace)
                originals[svc.hostname] = original if original is not None else svc
            ports_by_host.setdefault(svc.hostname, set()).update(p.port for p in svc.ports)
            deps.add(ConfigKey(Kind.SERVICE_ENTRY, svc.hostname, svc.namespace))
        for vs in listener.virtual_services:
            deps.add(vs.config.key)
            deps.update(vs.delegates)
    for hostname, original in originals.items():
        wanted = ports_by_host[hostname]
        svc = original
        if len(wanted) != len(original.ports):
            svc = dataclasses.replace(original, ports=tuple(p for p in original.ports if p.port in wanted))
        scope._by_host[hostname] = svc
        scope.services.append(svc)
    for svc in scope.services:
        rule = push.destination_rule(namespace, svc)
        scope.destination_rules[svc.hostname] = rule
        if rule is not None:
            deps.update(c.key for c in rule.configs)
    scope.dependencies = frozenset(deps)
    return scope
