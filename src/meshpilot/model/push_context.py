"""PushContext: an immutable snapshot of services and config, with the indexes generators read.

A full push builds a new PushContext; an endpoint-only push reuses the
current one, since endpoints live in the EndpointIndex.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar

from meshpilot.model import visibility
from meshpilot.model.config import Config, ConfigKey
from meshpilot.model.confighash import hash_value
from meshpilot.model.delegation import merge_delegates
from meshpilot.model.destination_rules import DestinationRuleIndex, rule_selector
from meshpilot.model.envoy_filters import EnvoyFilterIndex
from meshpilot.model.gateways import MESH_GATEWAY, MergedGateway, binds_gateway, merge_gateways
from meshpilot.model.hosts import resolve_short_name
from meshpilot.model.identity import same_objects
from meshpilot.model.jwks import JwksLookup, NoJwks
from meshpilot.model.kind import Kind
from meshpilot.model.labels import selector_matches
from meshpilot.model.peer_authentication import PeerAuthenticationIndex
from meshpilot.model.proxy import NodeType, Proxy
from meshpilot.model.service import Registry, Service
from meshpilot.model.sidecar_scope import SidecarScope, build_scope

_MEMO_LIMIT = 20000
#: ``carried``'s mark for a key the previous snapshot did not hold.
_NOT_CARRIED = object()
_NO_RULES: frozenset[ConfigKey] = frozenset()
T = TypeVar("T")

KindView = Mapping[tuple[str, str], Config]
#: ``kept_token``'s stand-in for a kind the store has never held: the same in every snapshot.
_NO_VIEW: KindView = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class VirtualServiceEntry:
    """A VirtualService with its hosts resolved to FQDNs."""

    config: Config
    hosts: tuple[str, ...]
    gateways: frozenset[str]
    export_to: frozenset[str]
    #: Delegate VirtualServices merged into this one (it depends on them).
    delegates: frozenset[ConfigKey] = frozenset()


def workload_selector(config: Config) -> dict[str, str] | None:
    """A Sidecar's or ServiceEntry's ``workloadSelector.labels``; None without one (an empty
    selector, not None, selects every workload)."""
    spec = config.spec
    return dict(spec.workload_selector.labels) if spec.HasField("workload_selector") else None


def _order(config: Config) -> tuple[str, str, str]:
    return (config.meta.creation_timestamp or "~", config.namespace, config.name)


class PushContext:
    """Everything a generator may read besides the proxy and the EndpointIndex."""

    def __init__(
        self,
        *,
        version: str,
        mesh: Any,
        services: Iterable[Service],
        configs: Mapping[Kind, KindView],
        domain_suffix: str = "cluster.local",
        service_accounts: Mapping[tuple[str, str], frozenset[str]] | None = None,
        lasting: dict[Hashable, Any] | None = None,
        share_outputs: bool = True,
        jwks: JwksLookup | None = None,
        services_token: object | None = None,
        carried_from: dict[Hashable, Any] | None = None,
    ) -> None:
        self.version = version
        #: Stands for the services in ``kept_token``: the environment hands the same object from
        #: snapshot to snapshot while its registries' services are the same objects (None: this
        #: snapshot's own, so nothing kept from another matches it).
        self.services_token = services_token if services_token is not None else object()
        #: JWKS fetched for RequestAuthentication ``jwksUri``s (none known: every one fails closed).
        self.jwks: JwksLookup = jwks if jwks is not None else NoJwks()
        #: False: every proxy's config is built for it alone (the XdsCache is off too).
        self.share_outputs = share_outputs
        self.mesh = mesh
        #: Stable hash of the MeshConfig: part of the cache keys of everything that reads it.
        self.mesh_fingerprint = hash_value(mesh)
        self.domain_suffix = domain_suffix
        self._configs = configs
        self._service_accounts = service_accounts or {}
        self._accounts_sorted: dict[tuple[str, str], tuple[str, ...]] = {}

        # Services: the first (oldest) service for a (hostname, namespace) wins, except
        # that a Kubernetes Service displaces a ServiceEntry of the same name, so a
        # ServiceEntry cannot squat on a Kubernetes hostname (istiod's initServiceRegistry).
        self._by_host_ns: dict[str, dict[str, Service]] = defaultdict(dict)
        for svc in sorted(services, key=lambda s: (s.creation_timestamp or "~", s.hostname, s.namespace)):
            existing = self._by_host_ns[svc.hostname].get(svc.namespace)
            if existing is None or (
                existing.registry is not Registry.KUBERNETES and svc.registry is Registry.KUBERNETES
            ):
                self._by_host_ns[svc.hostname][svc.namespace] = svc
        self.services: tuple[Service, ...] = tuple(
            sorted(
                (s for by_ns in self._by_host_ns.values() for s in by_ns.values()),
                key=lambda s: (s.creation_timestamp or "~", s.hostname, s.namespace),
            )
        )
        self._default_service_export = tuple(mesh.default_service_export_to)
        self._default_export_set = visibility.export_set((), self._default_service_export)
        self._services_visible: dict[str, list[Service]] = {}

        default_vs_export = tuple(mesh.default_virtual_service_export_to)
        self.virtual_services: list[VirtualServiceEntry] = []
        merged = merge_delegates(self.configs(Kind.VIRTUAL_SERVICE), frozenset(default_vs_export))
        for config in sorted(merged.configs, key=_order):
            spec = config.spec
            gateways = frozenset(spec.gateways) or frozenset({MESH_GATEWAY})
            hosts = tuple(resolve_short_name(h, config.namespace, domain_suffix) for h in spec.hosts)
            export_to = visibility.export_set(spec.export_to, default_vs_export)
            delegates = merged.delegates.get(config.key, frozenset())
            self.virtual_services.append(VirtualServiceEntry(config, hosts, gateways, export_to, delegates))
        self._vs_visible: dict[str, list[VirtualServiceEntry]] = {}
        self._gateways: dict[frozenset[tuple[str, str]], MergedGateway] = {}
        self._vs_by_gateway: dict[tuple[str, ConfigKey], list[VirtualServiceEntry]] = {}

        self.destination_rules = DestinationRuleIndex(
            self.configs(Kind.DESTINATION_RULE),
            default_export_to=mesh.default_destination_rule_export_to or ["*"],
            root_namespace=mesh.root_namespace,
            domain_suffix=domain_suffix,
        )
        # Workload-selected rules per namespace: proxies they select get scopes of their own.
        self._selector_rules: dict[str, list[tuple[Config, dict[str, str]]]] = defaultdict(list)
        for config in self.configs(Kind.DESTINATION_RULE):
            selector = rule_selector(config)
            if selector is not None:
                self._selector_rules[config.namespace].append((config, selector))
        #: PeerAuthentication resolved as istiod resolves it (mTLS modes of workloads and services).
        self.peer_authentication = PeerAuthenticationIndex(
            self.configs(Kind.PEER_AUTHENTICATION), mesh.root_namespace or "istio-system"
        )
        #: EnvoyFilters by namespace, and the patches each proxy takes (empty: no proxy takes any).
        self.envoy_filters = EnvoyFilterIndex(self.configs(Kind.ENVOY_FILTER), mesh.root_namespace)
        self._sidecars: dict[str, list[Config]] = defaultdict(list)
        for config in self.configs(Kind.SIDECAR):
            self._sidecars[config.namespace].append(config)
        self._scopes: dict[tuple[str, str, str, frozenset[ConfigKey]], SidecarScope] = {}
        #: Generated outputs shared by proxies that read the same inputs (see ``memoized``).
        self._memo: dict[Hashable, Any] = {}
        #: Outputs that depend on nothing but their key, kept from snapshot to snapshot.
        self._lasting: dict[Hashable, Any] = lasting if lasting is not None else {}
        #: ``carried``'s entries: this snapshot's, and those of the one before it to take over.
        self._carried: dict[Hashable, Any] = {}
        self._carried_from: dict[Hashable, Any] = carried_from if carried_from is not None else {}

    # -- configs -----------------------------------------------------------------

    def configs(self, kind: Kind, namespace: str | None = None) -> list[Config]:
        """Configs of a kind, oldest first."""
        view = self._configs.get(kind, {})
        items = [c for c in view.values() if namespace is None or c.namespace == namespace]
        return sorted(items, key=_order)

    # -- services ---------------------------------------------------------------

    def service(self, hostname: str, namespace: str) -> Service | None:
        return self._by_host_ns.get(hostname, {}).get(namespace)

    def services_for_hostname(self, hostname: str) -> list[Service]:
        return list(self._by_host_ns.get(hostname, {}).values())

    def service_export_to(self, svc: Service) -> frozenset[str]:
        # Most services set no exportTo: they share one set instead of building it per call.
        if not svc.export_to:
            return self._default_export_set
        return visibility.export_set(svc.export_to, self._default_service_export)

    def services_visible_to(self, namespace: str) -> list[Service]:
        """Services ``namespace`` sees: its private ones, those exported to it, then public ones.

        Each group is oldest first; sidecar scopes pick hostnames in this order.
        """
        found = self._services_visible.get(namespace)
        if found is None:
            public, restricted = self._services_by_export
            ranked = []
            for s in restricted:
                export_to = self.service_export_to(s)
                if visibility.visible_to(export_to, s.namespace, namespace):
                    ranked.append((visibility.scope_rank(export_to, s.namespace, namespace), s))
            # Public services rank last, in their own order. A namespace that sees no other service
            # shares their list: every such namespace's default scope then imports the same
            # (``sidecar_scope.build_scope`` builds that part once).
            found = [s for _, s in sorted(ranked, key=lambda pair: pair[0])] + public if ranked else public
            self._services_visible[namespace] = found
        return found

    @functools.cached_property
    def _services_by_export(self) -> tuple[list[Service], list[Service]]:
        """(public services, the others), each oldest first: most meshes export every service."""
        public: list[Service] = []
        restricted: list[Service] = []
        for s in self.services:
            (public if visibility.PUBLIC in self.service_export_to(s) else restricted).append(s)
        return public, restricted

    def service_accounts(self, svc: Service) -> tuple[str, ...]:
        """Identities allowed to serve ``svc``: its endpoints' and its own, sorted."""
        key = (svc.hostname, svc.namespace)
        found = self._accounts_sorted.get(key)
        if found is None:
            from_endpoints = self._service_accounts.get(key, frozenset())
            found = tuple(sorted(from_endpoints | set(svc.service_accounts)))
            self._accounts_sorted[key] = found
        return found

    # -- routing config -------------------------------------------------------------

    def virtual_services_visible_to(self, namespace: str) -> list[VirtualServiceEntry]:
        """VirtualServices for sidecars (gateway ``mesh``) that ``namespace`` sees.

        The namespace's private ones first, then those exported to it, then
        public ones, each oldest first: the first VirtualService for a host wins.
        """
        found = self._vs_visible.get(namespace)
        if found is None:
            ranked = [
                (visibility.scope_rank(vs.export_to, vs.config.namespace, namespace), vs)
                for vs in self.virtual_services
                if MESH_GATEWAY in vs.gateways
                and visibility.visible_to(vs.export_to, vs.config.namespace, namespace)
            ]
            found = [vs for _, vs in sorted(ranked, key=lambda pair: pair[0])]
            self._vs_visible[namespace] = found
        return found

    def merged_gateway(self, proxy: Proxy) -> MergedGateway:
        """The servers of the Gateways that select a router, merged."""
        key = frozenset(proxy.labels.items())
        found = self._gateways.get(key)
        if found is None:
            found = merge_gateways(self.configs(Kind.GATEWAY), proxy.labels)
            self._gateways[key] = found
        return found

    def virtual_services_for_gateway(self, namespace: str, gateway: ConfigKey) -> list[VirtualServiceEntry]:
        """VirtualServices bound to ``gateway`` that ``namespace`` (the router's) sees, in the order
        ``virtual_services_visible_to`` gives sidecars."""
        key = (namespace, gateway)
        found = self._vs_by_gateway.get(key)
        if found is None:
            ranked = [
                (visibility.scope_rank(vs.export_to, vs.config.namespace, namespace), vs)
                for vs in self.virtual_services
                if binds_gateway(vs.config.namespace, vs.gateways, gateway, self.domain_suffix)
                and visibility.visible_to(vs.export_to, vs.config.namespace, namespace)
            ]
            found = [vs for _, vs in sorted(ranked, key=lambda pair: pair[0])]
            self._vs_by_gateway[key] = found
        return found

    def selector_rules_for(self, namespace: str, labels: Mapping[str, str]) -> frozenset[ConfigKey]:
        """Keys of the workload-selected DestinationRules of ``namespace`` that select ``labels``."""
        rules = self._selector_rules.get(namespace)
        if not rules:
            return _NO_RULES  # most namespaces have none: no set built per proxy of a push
        return frozenset(config.key for config, selector in rules if selector_matches(selector, labels))

    # -- shared generation results ------------------------------------------------------

    def memoized(self, key: Hashable, make: Callable[[], T]) -> T:
        """``make()``'s result, computed once per snapshot for ``key``.

        The key must name every input ``make`` reads beyond this snapshot. The
        memo is bounded: a long run of endpoint-only pushes (whose keys carry
        the EndpointIndex generation) cannot make it grow without end.
        """
        if not self.share_outputs:
            return make()
        return _remembered(self._memo, key, make)

    def memoized_lasting(self, key: Hashable, make: Callable[[], T]) -> T:
        """``make()``'s result for ``key``, kept across snapshots.

        Only for outputs that read nothing of the snapshot but the MeshConfig
        and domain suffix (added to the key here) and what the key names, such
        as a proxy's inbound listeners: a VirtualService change then does not
        rebuild them for every proxy.
        """
        if not self.share_outputs:
            return make()
        return _remembered(self._lasting, (key, self.mesh_fingerprint, self.domain_suffix), make)

    def carried(self, key: Hashable, make: Callable[[], T]) -> T:
        """``make()``'s result for ``key``, or the previous snapshot's for the same key; either is
        handed on to the next snapshot, if that one asks for it too.

        For outputs that are a function of their key (which names its inputs by ``id``, and then the
        entry holds those objects, so that no other object takes their ids while it lives), or whose
        caller checks what it is handed (``same_list``, keyed by a digest). A push that builds a
        workload's clusters and listeners again so reuses the lists it was sent last time (a
        thousand entries each in the benchmark) when they are the same; a VirtualService push
        mostly does not build them at all (``xds.dependencies.clusters_kept``). What the previous snapshot
        held is let go when the push queue is next idle (``release_carried``); entries this snapshot
        did not ask for go with it.
        """
        if not self.share_outputs:
            return make()

        def taken_over() -> T:
            found = self._carried_from.get(key, _NOT_CARRIED)
            return make() if found is _NOT_CARRIED else found

        return _remembered(self._carried, key, taken_over)

    def release_carried(self) -> None:
        """Let the previous snapshot's ``carried`` entries go, once the proxies pushed with this
        snapshot have taken over what they need: what is left is a changed service's list, or one of
        a proxy that left or that the push did not concern (which builds it again when next pushed)."""
        self._carried_from = {}

    @property
    def carried_on(self) -> dict[Hashable, Any]:
        """What the next snapshot takes ``carried`` entries from (``carried_from``)."""
        return self._carried

    def kept_token(self, kinds: tuple[Kind, ...]) -> tuple[object, ...]:
        """What an answer kept from one snapshot to the next compares, element by element and by
        identity (``same_token``), to know that it read nothing that changed since: the views of
        ``kinds`` (ConfigStore.snapshot hands a kind's view on while the kind is unchanged), the
        services' token, the MeshConfig and the domain suffix. Once per snapshot for ``kinds``."""
        found: tuple[object, ...] = _remembered(
            self._memo,
            ("kept-token", kinds),
            lambda: (
                *(self._configs.get(kind, _NO_VIEW) for kind in kinds),
                self.services_token,
                self.mesh,
                self.domain_suffix,
            ),
        )
        return found

    # -- sidecar scopes -------------------------------------------------------------

    def sidecar_for(self, namespace: str, labels: Mapping[str, str]) -> Config | None:
        """The Sidecar that applies to a workload, as istiod picks it.

        A Sidecar in the workload's namespace whose selector matches wins
        (oldest first), then the namespace's Sidecar without a selector, then
        the root namespace's Sidecar without a selector.
        """
        candidates = self._sidecars.get(namespace, [])
        for config in candidates:
            selector = workload_selector(config)
            if selector is not None and selector_matches(selector, labels):
                return config
        for config in candidates:
            if workload_selector(config) is None:
                return config
        # The root namespace's first Sidecar without a selector is the mesh-wide default.
        for config in self._sidecars.get(self.mesh.root_namespace, []):
            if workload_selector(config) is None:
                return config
        return None

    def sidecar_scope(self, proxy: Proxy) -> SidecarScope:
        namespace = proxy.config_namespace
        # Gateways and waypoints never take a Sidecar resource (istiod's DefaultSidecarScopeForGateway).
        sidecar = self.sidecar_for(namespace, proxy.labels) if proxy.type is NodeType.SIDECAR else None
        selected_rules = self.selector_rules_for(namespace, proxy.labels)
        key = (
            namespace,
            sidecar.namespace if sidecar else "",
            sidecar.name if sidecar else "",
            selected_rules,
        )
        scope = self._scopes.get(key)
        if scope is None:
            scope = build_scope(self, namespace, sidecar, selected_rules)
            self._scopes[key] = scope
        return scope


def same_token(kept: tuple[object, ...], now: tuple[object, ...]) -> bool:
    """Whether two ``kept_token``s name the same inputs: the same objects, not equal ones (a view
    compares its configs by value, which costs what keeping the answer saves)."""
    return same_objects(kept, now)


def _remembered(store: dict[Hashable, Any], key: Hashable, make: Callable[[], T]) -> T:
    """``store[key]``, made on a miss; a full store is emptied first, so it stays bounded."""
    try:
        return store[key]  # type: ignore[no-any-return]
    except KeyError:
        pass
    if len(store) >= _MEMO_LIMIT:
        store.clear()
    value = make()
    store[key] = value
    return value
