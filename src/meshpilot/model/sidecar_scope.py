"""SidecarScope: what one sidecar sees, from its Sidecar resource or the defaults.

A scope lists, per egress listener, the services and VirtualServices a proxy
imports, the union of services (plus those VirtualServices route to) for its
clusters, the DestinationRule for each, and the config keys it depends on, so
a change outside the scope does not push to the proxy. It follows istiod's
``convertToSidecarScope`` (pilot/pkg/model/sidecar.go).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from meshpilot.model import visibility
from meshpilot.model.config import Config, ConfigKey
from meshpilot.model.destination_rules import MergedDestinationRule
from meshpilot.model.hosts import host_matches, host_subset_of, is_wildcard, resolve_short_name
from meshpilot.model.kind import Kind
from meshpilot.model.protocol import Protocol
from meshpilot.model.service import Registry, Resolution, Service

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
    {
        Kind.PEER_AUTHENTICATION,
        Kind.AUTHORIZATION_POLICY,
        Kind.REQUEST_AUTHENTICATION,
        Kind.ENVOY_FILTER,
        Kind.TELEMETRY,
    }
)
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


@dataclass(slots=True)
class SidecarScope:
    name: str
    namespace: str
    config: Config | None
    egress: tuple[EgressListener, ...]
    ingress: tuple[Any, ...]
    #: OutboundTrafficPolicy.Mode number (REGISTRY_ONLY=0, ALLOW_ANY=1), the Sidecar's or the mesh's.
    outbound_traffic_policy: int
    #: The Sidecar's outboundTrafficPolicy.egressProxy (a Destination), if any.
    egress_proxy: Any | None = None
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
        if key.kind is Kind.PEER_AUTHENTICATION and key.namespace in self.service_namespaces:
            # Clients read their servers' modes too: auto mTLS of clusters, tlsMode marks in EDS
            # (istiod's selectAuthnPolicies keeps the imported services' namespaces).
            return True
        if key.kind in NAMESPACED_POLICY_KINDS:
            return key.namespace in (self.namespace, root_namespace)
        if key.kind not in SCOPED_KINDS:
            return True
        return key in self.dependencies

    @property
    def service_namespaces(self) -> frozenset[str]:
        """The namespaces of the imported services."""
        found = self.memo.get("service_namespaces")
        if found is None:
            found = self.memo["service_namespaces"] = frozenset(s.namespace for s in self.services)
        assert isinstance(found, frozenset)
        return found

    def import_signature(self) -> tuple[tuple[int, int | None], ...]:
        """What the scope imports, for telling apart the outputs built from it: each service by
        identity, in order, with its DestinationRule by fingerprint (each namespace's lookup merges
        its own copy of a rule; the fingerprint is all cluster cache keys take of it). Once per scope."""
        found = self.memo.get("import_signature")
        if found is None:
            rule = self.destination_rule
            found = self.memo["import_signature"] = tuple(
                (id(svc), r.fingerprint if (r := rule(svc.hostname)) is not None else None)
                for svc in self.services
            )
        assert isinstance(found, tuple)
        return found

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

    def egress_listener_for_port(self, port: int, bind: str = "") -> EgressListener | None:
        """The listener with this port (a unix socket listener by its bind), or the catch-all one."""
        for listener in self.egress:
            if listener.port is None:
                return listener
            if listener.port.number == port and (port != 0 or listener.bind == bind):
                return listener
        return None

    @property
    def has_ingress(self) -> bool:
        return bool(self.ingress)

    def inbound_connection_pool(self, port: int) -> Any | None:
        """The connection pool for inbound traffic to ``port``: its ingress listener's, else the Sidecar's."""
        if self.config is None:
            return None
        for ingress in self.ingress:
            if ingress.port.number == port and ingress.HasField("connection_pool"):
                return ingress.connection_pool
        spec = self.config.spec
        return spec.inbound_connection_pool if spec.HasField("inbound_connection_pool") else None

    @property
    def inbound_pool_key(self) -> tuple[str, int] | None:
        """Identifies the Sidecar's inbound connection pools, for keys of what is built from them."""
        if self.config is None or not self.config.spec.HasField("inbound_connection_pool"):
            return None
        return (str(self.config.key), self.config.spec_hash)


# -- selecting what an egress listener imports ---------------------------------------


def _matching_port(svc: Service, listener: EgressListener) -> Service | None:
    if not listener.matches_port or listener.port is None:
        return svc
    port = svc.port(listener.port.number)
    if port is None:
        return None
    return svc if len(svc.ports) == 1 else dataclasses.replace(svc, ports=(port,))


def _select_services(
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
                found = _matching_port(svc, listener)
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


def _select_virtual_services(
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


def _matching_destination_ports(svc: Service, ports: set[int]) -> Service | None:
    if not ports or 0 in ports:
        return svc
    found = tuple(p for p in svc.ports if p.port in ports)
    if len(found) == len(svc.ports):
        return svc
    return dataclasses.replace(svc, ports=found) if found else None


# -- assembling the scope -----------------------------------------------------------------


class _ServiceUnion:
    """The scope's services across listeners, merged per hostname as istiod's appendSidecarServices."""

    def __init__(self, base: _Imported | None = None) -> None:
        self.services: list[Service] = list(base.services) if base is not None else []
        self.index: dict[str, int] = dict(base.index) if base is not None else {}
        #: Positions taken from ``base``; ``displaced`` tells whether one of them was replaced.
        self.base_count = len(self.services)
        self.displaced = False

    def add(self, svc: Service | None) -> None:
        if svc is None:
            return
        position = self.index.get(svc.hostname)
        if position is None:
            self.index[svc.hostname] = len(self.services)
            self.services.append(svc)
            return
        existing = self.services[position]
        if existing is svc:
            return
        existing_kube = existing.registry is Registry.KUBERNETES
        new_kube = svc.registry is Registry.KUBERNETES
        if existing_kube and not new_kube:
            return
        if new_kube and not existing_kube:
            self._replace(position, svc)
            return
        if existing.ports == svc.ports or not _can_merge(existing, svc):
            return
        numbers = {p.port for p in existing.ports}
        extra = tuple(p for p in svc.ports if p.port not in numbers)
        if extra:
            # Only a copy that adds ports replaces the service: the same object kept lets scopes
            # of other namespaces share what is built from it (``import_signature``).
            self._replace(position, dataclasses.replace(existing, ports=existing.ports + extra))

    def _replace(self, position: int, svc: Service) -> None:
        self.services[position] = svc
        self.displaced = self.displaced or position < self.base_count


@dataclass(slots=True)
class _Imported:
    """The scope's services with what each brings: its DestinationRule and the keys it depends on."""

    services: list[Service] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)
    by_host: dict[str, Service] = field(default_factory=dict)
    rules: dict[str, MergedDestinationRule | None] = field(default_factory=dict)
    dependencies: set[ConfigKey] = field(default_factory=set)

    def take(
        self, push: PushContext, namespace: str, selector_rules: frozenset[ConfigKey], svc: Service
    ) -> None:
        self.index.setdefault(svc.hostname, len(self.services))
        self.by_host[svc.hostname] = svc
        self.services.append(svc)
        entries = push.destination_rules.lookup(namespace, svc.hostname, svc.namespace)
        self.rules[svc.hostname] = _pick_rule(entries, namespace, selector_rules)
        for entry in entries:
            self.dependencies.update(c.key for c in entry.configs)
        self.dependencies.add(ConfigKey(Kind.SERVICE_ENTRY, svc.hostname, svc.namespace))

    def copy(self) -> _Imported:
        return _Imported(
            list(self.services),
            dict(self.index),
            dict(self.by_host),
            dict(self.rules),
            set(self.dependencies),
        )


@dataclass(frozen=True, slots=True)
class _DefaultImports:
    """What the default scope's catch-all listener imports from ``visible``, where that reads nothing
    of the namespace: built once per snapshot for every namespace that shares ``visible``."""

    #: Held so that no other list takes its id (the memo's key) while this lives.
    visible: list[Service]
    #: The listener's services: one tuple for every scope that shares them.
    services: tuple[Service, ...]
    imported: _Imported
    #: Namespaces with their own copy of a hostname another namespace also has: theirs wins there.
    owners_of_shared_hostnames: frozenset[str]


def _default_imports(push: PushContext, namespace: str, visible: list[Service]) -> _DefaultImports | None:
    """The services part of ``namespace``'s default scope as every namespace that shares ``visible``
    (``PushContext.services_visible_to``: usually all of them) and reads the DestinationRules as others
    do (``DestinationRuleIndex.same_for``) has it; None where the namespace decides something.
    A full push built it per namespace: with a hundred namespaces, most of the push's time."""
    if not push.share_outputs or not push.destination_rules.same_for(namespace):
        return None  # nothing shared: built per namespace, as before, without copying
    found: _DefaultImports = push.memoized(
        ("default-scope-imports", id(visible)), lambda: _build_default_imports(push, namespace, visible)
    )
    if found.visible is not visible or namespace in found.owners_of_shared_hostnames:
        return None
    return found


def _build_default_imports(push: PushContext, namespace: str, visible: list[Service]) -> _DefaultImports:
    # No service lives in namespace "": the choice between copies of a hostname is then the one
    # every namespace without a copy makes.
    port, bind, capture, hosts = _egress_specs(None)[0]
    listener = EgressListener(port, bind, capture, parse_egress_hosts(hosts, ""))
    services = _select_services(visible, listener, "")
    imported = _Imported()
    for svc in services:
        # ``namespace``'s lookups are every sharing namespace's (``same_for``); no selector rules.
        imported.take(push, namespace, frozenset(), svc)
    seen: dict[str, str] = {}
    owners: set[str] = set()
    for svc in visible:
        first = seen.setdefault(svc.hostname, svc.namespace)
        if first != svc.namespace:
            owners.update((first, svc.namespace))
    return _DefaultImports(visible, services, imported, frozenset(owners))


def _can_merge(a: Service, b: Service) -> bool:
    return (
        a.namespace == b.namespace
        and a.resolution is b.resolution
        and a.registry is b.registry
        and a.labels == b.labels
        and a.selector == b.selector
        and a.export_to == b.export_to
    )


def _egress_specs(sidecar: Config | None) -> list[tuple[Any | None, str, int, list[str]]]:
    default: list[tuple[Any | None, str, int, list[str]]] = [(None, "", CAPTURE_DEFAULT, ["*/*"])]
    if sidecar is None:
        return default
    return [
        (e.port if e.HasField("port") else None, e.bind, e.capture_mode, list(e.hosts))
        for e in sidecar.spec.egress
    ] or default


def build_scope(
    push: PushContext,
    namespace: str,
    sidecar: Config | None,
    selector_rules: frozenset[ConfigKey] = frozenset(),
) -> SidecarScope:
    """The scope of proxies in ``namespace`` selected by ``sidecar`` (None: the default).

    ``selector_rules`` names the DestinationRules with a workload selector
    that apply to these proxies: proxies that differ in them get different
    scopes, so everything built from a scope is right for each of its proxies.
    """
    policy = push.mesh.outbound_traffic_policy.mode
    egress_proxy = None
    ingress: tuple[Any, ...] = ()
    name = DEFAULT_SCOPE_NAME
    if sidecar is not None:
        spec = sidecar.spec
        ingress = tuple(spec.ingress)
        name = sidecar.name
        if spec.HasField("outbound_traffic_policy"):
            policy = spec.outbound_traffic_policy.mode
            if spec.outbound_traffic_policy.HasField("egress_proxy"):
                egress_proxy = spec.outbound_traffic_policy.egress_proxy

    visible_services = push.services_visible_to(namespace)
    default = sidecar is None and not selector_rules
    shared = _default_imports(push, namespace, visible_services) if default else None
    scope = SidecarScope(name, namespace, sidecar, (), ingress, policy, egress_proxy)
    if not _assemble(push, scope, selector_rules, visible_services, shared):
        # A VirtualService destination replaced a shared service: this namespace's own scope.
        scope = SidecarScope(name, namespace, sidecar, (), ingress, policy, egress_proxy)
        _assemble(push, scope, selector_rules, visible_services, None)
    return scope


def _assemble(
    push: PushContext,
    scope: SidecarScope,
    selector_rules: frozenset[ConfigKey],
    visible_services: list[Service],
    shared: _DefaultImports | None,
) -> bool:
    """Fill ``scope`` in; False, leaving it unfinished, if a service of ``shared`` was displaced."""
    namespace, sidecar = scope.namespace, scope.config
    visible_vs = push.virtual_services_visible_to(namespace)
    egress = []
    for port, bind, capture, hosts_text in _egress_specs(sidecar):
        listener = EgressListener(port, bind, capture, parse_egress_hosts(hosts_text, namespace))
        listener = dataclasses.replace(
            listener,
            services=shared.services
            if shared is not None
            else _select_services(visible_services, listener, namespace),
            virtual_services=_select_virtual_services(visible_vs, listener),
        )
        egress.append(listener)
    scope.egress = tuple(egress)

    deps: set[ConfigKey] = set()
    if sidecar is not None:
        deps.add(sidecar.key)
    union = _ServiceUnion(shared.imported if shared is not None else None)
    for listener in scope.egress:
        if shared is None:
            # Services the hosts name explicitly first, so a VirtualService destination cannot displace them.
            for svc in listener.services:
                union.add(svc)
        for vs in listener.virtual_services:
            deps.add(vs.config.key)
            # The scope depends on the delegates merged into its VirtualServices too.
            deps.update(vs.delegates)
            destinations = virtual_service_destinations(vs.config, namespace, push.domain_suffix)
            for host, ports in destinations.items():
                union.add(_destination_service(push, host, namespace, listener, ports))
    if union.displaced:
        return False
    imported = shared.imported.copy() if shared is not None else _Imported()
    for svc in union.services[len(imported.services) :]:
        imported.take(push, namespace, selector_rules, svc)
    scope.services = imported.services
    scope._by_host = imported.by_host
    scope.destination_rules = imported.rules
    scope.dependencies = frozenset(deps | imported.dependencies)
    return True


def _destination_service(
    push: PushContext, host: str, namespace: str, listener: EgressListener, ports: set[int]
) -> Service | None:
    """The service a VirtualService destination names, as the scope imports it."""
    by_namespace = {s.namespace: s for s in push.services_for_hostname(host)}
    svc = by_namespace.get(namespace)
    if svc is None:
        # Not in the config namespace: the first visible namespace, alphabetically.
        visible = sorted(
            ns
            for ns, s in by_namespace.items()
            if visibility.visible_to(push.service_export_to(s), s.namespace, namespace)
        )
        if not visible:
            return None
        svc = by_namespace[visible[0]]
    if listener.matches_port:
        return _matching_port(svc, listener)
    return _matching_destination_ports(svc, ports)


def _pick_rule(
    entries: list[MergedDestinationRule], namespace: str, selector_rules: frozenset[ConfigKey]
) -> MergedDestinationRule | None:
    """A selector rule of the scope's namespace that applies, else the last rule without a selector."""
    catch_all = None
    for entry in entries:
        if entry.selector is None:
            catch_all = entry
        elif entry.namespace == namespace and entry.first.key in selector_rules:
            return entry
    return catch_all
