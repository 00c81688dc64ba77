"""SidecarScope: what one sidecar sees, from its Sidecar resource or the defaults.

A scope lists, per egress listener, the services and VirtualServices a proxy
imports, the union of services (plus those VirtualServices route to) for its
clusters, the DestinationRule for each, and the config keys it depends on, so
a change outside the scope does not push to the proxy. It follows istiod's
``convertToSidecarScope`` (pilot/pkg/model/sidecar.go).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from meshpilot.model import visibility
from meshpilot.model.config import Config, ConfigKey
from meshpilot.model.destination_rules import MergedDestinationRule
from meshpilot.model.egress_imports import (
    EgressListener,
    egress_specs,
    matching_destination_ports,
    matching_port,
    parse_egress_hosts,
    select_services,
    select_virtual_services,
    virtual_service_destinations,
)
from meshpilot.model.kind import Kind
from meshpilot.model.service import Registry, Resolution, Service

if TYPE_CHECKING:
    from meshpilot.model.push_context import PushContext

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


#: Every kind but VirtualServices (``SidecarScope.snapshot_token``).
_NOT_VIRTUAL_SERVICES = tuple(k for k in Kind if k is not Kind.VIRTUAL_SERVICE)
_SERIALS = itertools.count(1)


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
    #: Values derived from the scope (cache key parts), computed once per scope; one is carried on to
    #: the next snapshot's scope of the same imports (``xds.dependencies._same_clusters``).
    memo: dict[object, object] = field(default_factory=dict)
    #: Its snapshot's ``kept_token`` of every kind but VirtualServices (with the services' token and
    #: the MeshConfig): scopes whose tokens hold the same objects (``same_token``) come from snapshots
    #: that differ at most in VirtualServices and endpoints (``xds.dependencies.clusters_kept``).
    #: A scope not made by ``build_scope`` matches no other.
    snapshot_token: tuple[object, ...] = field(default_factory=lambda: (object(),))
    #: Tells scopes apart for as long as the process lives (``WatchedResource.built_for``).
    serial: int = field(init=False, default_factory=lambda: next(_SERIALS))

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
            found = self.memo["import_signature"] = _import_signature(self.services, self.destination_rules)
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
    #: ``SidecarScope.import_signature`` of a scope that imports these and nothing else.
    signature: tuple[tuple[int, int | None], ...]


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
    port, bind, capture, hosts = egress_specs(None)[0]
    listener = EgressListener(port, bind, capture, parse_egress_hosts(hosts, ""))
    services = select_services(visible, listener, "")
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
    signature = _import_signature(imported.services, imported.rules)
    return _DefaultImports(visible, services, imported, frozenset(owners), signature)


def _import_signature(
    services: list[Service], rules: Mapping[str, MergedDestinationRule | None]
) -> tuple[tuple[int, int | None], ...]:
    return tuple(
        (id(svc), r.fingerprint if (r := rules.get(svc.hostname)) is not None else None) for svc in services
    )


def _can_merge(a: Service, b: Service) -> bool:
    return (
        a.namespace == b.namespace
        and a.resolution is b.resolution
        and a.registry is b.registry
        and a.labels == b.labels
        and a.selector == b.selector
        and a.export_to == b.export_to
    )


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
    scope.snapshot_token = push.kept_token(_NOT_VIRTUAL_SERVICES)
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
    for port, bind, capture, hosts_text in egress_specs(sidecar):
        listener = EgressListener(port, bind, capture, parse_egress_hosts(hosts_text, namespace))
        listener = dataclasses.replace(
            listener,
            services=shared.services
            if shared is not None
            else select_services(visible_services, listener, namespace),
            virtual_services=select_virtual_services(visible_vs, listener),
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
    if shared is not None and len(imported.services) == len(shared.imported.services):
        # Nothing of its own: the shared signature, not one more walk of every service per namespace.
        scope.memo["import_signature"] = shared.signature
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
        return matching_port(svc, listener)
    return matching_destination_ports(svc, ports)


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
