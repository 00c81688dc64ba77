"""DestinationRules indexed by host, merged and looked up as istiod does.

istiod keeps three indexes (``setDestinationRules``): rules each namespace
sees locally, rules each namespace exports, and the root namespace's private
rules. A proxy looks in its own namespace first, then in the service's
namespace's exports, then in the root namespace's exports. Rules for one host
merge into one entry when their exportTo and workload selectors agree; rules
that cannot merge stay separate entries, and the proxy's labels pick among
them (``SidecarScope.DestinationRule``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from meshpilot.model import visibility
from meshpilot.model.config import Config
from meshpilot.model.confighash import hash_value
from meshpilot.model.hosts import is_wildcard, most_specific_match, resolve_short_name


@dataclass(frozen=True, slots=True)
class MergedDestinationRule:
    """The DestinationRules that apply to one host, merged.

    The first (oldest) rule's traffic policy applies; subsets are the union,
    the first definition of a name winning. ``configs`` lists the contributors,
    whose keys are cache and push dependencies.
    """

    host: str
    configs: tuple[Config, ...]
    export_to: frozenset[str]
    #: The first rule's workloadSelector labels; None for a rule without one.
    selector: Mapping[str, str] | None = None
    #: Stable hash of the contributing configs: part of the cache keys of what reads the rule.
    fingerprint: int = field(init=False, compare=False, repr=False)
    _spec: Any = field(default=None, init=False, compare=False, repr=False)
    #: ``subsets`` by name, worked out on first use: builders ask for a subset once per cluster.
    _subsets: dict[str, Any] | None = field(default=None, init=False, compare=False, repr=False)
    #: What builders derive from this (immutable) rule alone, such as the policy of each subset and
    #: port (``traffic_policy.cluster_policy``): computed once per rule, not once per cluster.
    derived: dict[Hashable, Any] = field(default_factory=dict, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        parts = tuple((str(c.key), c.spec_hash) for c in self.configs)
        object.__setattr__(self, "fingerprint", hash_value((self.host, parts)))

    @property
    def traffic_policy(self) -> Any | None:
        for config in self.configs:
            if config.spec.HasField("traffic_policy"):
                return config.spec.traffic_policy
        return None

    def _subsets_by_name(self) -> dict[str, Any]:
        found = self._subsets
        if found is None:
            found = {}
            for config in self.configs:
                for subset in config.spec.subsets:
                    found.setdefault(subset.name, subset)  # the first definition of a name wins
            object.__setattr__(self, "_subsets", found)  # a cache on a frozen object
        return found

    @property
    def subsets(self) -> list[Any]:
        return list(self._subsets_by_name().values())

    def subset(self, name: str) -> Any | None:
        return self._subsets_by_name().get(name)

    @property
    def first(self) -> Config:
        return self.configs[0]

    @property
    def spec(self) -> Any:
        """The merged DestinationRule as istiod holds it.

        The first rule, with the later rules' new subsets appended and the
        first traffic policy among them if the first rule has none.
        """
        if self._spec is None:
            if len(self.configs) == 1:
                merged = self.configs[0].spec
            else:
                merged = type(self.configs[0].spec)()
                merged.CopyFrom(self.configs[0].spec)
                del merged.subsets[:]
                merged.subsets.extend(self.subsets)
                policy = self.traffic_policy
                if policy is not None and not merged.HasField("traffic_policy"):
                    merged.traffic_policy.CopyFrom(policy)
            object.__setattr__(self, "_spec", merged)
        return self._spec

    @property
    def namespace(self) -> str:
        return self.configs[0].namespace

    def with_config(self, config: Config) -> MergedDestinationRule:
        return MergedDestinationRule(self.host, (*self.configs, config), self.export_to, self.selector)


def rule_selector(config: Config) -> dict[str, str] | None:
    spec = config.spec
    return dict(spec.workload_selector.match_labels) if spec.HasField("workload_selector") else None


def _sort_key(config: Config) -> tuple[int, str, str, str]:
    # Rules with a workload selector first, then oldest first (istiod's
    # sortConfigBySelectorAndCreationTime): the first rule's traffic policy wins a merge.
    return (
        0 if config.spec.HasField("workload_selector") else 1,
        config.meta.creation_timestamp or "~",
        config.name,
        config.namespace,
    )


class _HostRules:
    """Merged entries per host in one index (istiod's consolidatedDestRules)."""

    def __init__(self) -> None:
        self.by_host: dict[str, list[MergedDestinationRule]] = defaultdict(list)
        #: The wildcard hosts among ``by_host``'s, found on the first lookup (none: most meshes).
        self._wildcards: list[str] | None = None

    def merge(self, host: str, config: Config, export_to: frozenset[str]) -> None:
        """Add ``config`` as istiod's mergeDestinationRule does (enhanced merge on, its default)."""
        self._wildcards = None
        entries = self.by_host[host]
        selector = rule_selector(config)
        separate = True
        for index, entry in enumerate(entries):
            if export_to == entry.export_to:
                separate = False
            elif entry.export_to and export_to >= entry.export_to:
                separate = True
            else:
                continue
            if selector is not None and entry.selector is not None and dict(entry.selector) != selector:
                separate = True
                continue
            if (selector is None) == (entry.selector is None):
                # Both without a selector, or both with the same one: one merged entry.
                separate = False
            # The later rule adds its new subsets (and a traffic policy if the entry had none).
            entries[index] = entry.with_config(config)
        if separate:
            entries.append(MergedDestinationRule(host, (config,), export_to, selector))

    def lookup(self, host: str) -> list[MergedDestinationRule]:
        # The exact host wins (``most_specific_match``); else only a wildcard host can match. A scope
        # looks up each of its services here: a scan of every host made that quadratic.
        exact = self.by_host.get(host)
        if exact:
            return exact
        wildcards = self._wildcards
        if wildcards is None:
            wildcards = self._wildcards = [h for h in self.by_host if is_wildcard(h)]
        match = most_specific_match(host, wildcards) if wildcards else None
        return self.by_host[match] if match is not None else []


class DestinationRuleIndex:
    """Rules local to each namespace, rules each namespace exports, the root namespace's private rules."""

    def __init__(
        self,
        configs: Iterable[Config],
        *,
        default_export_to: Iterable[str],
        root_namespace: str,
        domain_suffix: str,
    ) -> None:
        self.root_namespace = root_namespace
        self._local: dict[str, _HostRules] = defaultdict(_HostRules)
        self._exported: dict[str, _HostRules] = defaultdict(_HostRules)
        self._root_local = _HostRules()
        #: Whether an exported rule is visible to some namespaces only (``same_for``); worked out once.
        self._targeted: bool | None = None
        defaults = frozenset(default_export_to) or frozenset({visibility.PUBLIC})
        for config in sorted(configs, key=_sort_key):
            spec = config.spec
            namespace = config.namespace
            host = resolve_short_name(spec.host, namespace, domain_suffix)
            # A rule with a workload selector never leaves its namespace.
            export_to = (
                frozenset({visibility.PRIVATE})
                if spec.HasField("workload_selector")
                else frozenset(spec.export_to)
            )
            if (
                not export_to
                or visibility.PUBLIC in export_to
                or visibility.PRIVATE in export_to
                or namespace in export_to
            ):
                self._local[namespace].merge(host, config, export_to)
            private_only = (not export_to and visibility.PRIVATE in defaults) or (
                len(export_to) == 1 and (visibility.PRIVATE in export_to or namespace in export_to)
            )
            if not private_only:
                self._exported[namespace].merge(host, config, export_to)
            elif namespace == root_namespace:
                self._root_local.merge(host, config, export_to)

    def same_for(self, proxy_namespace: str) -> bool:
        """Whether ``lookup`` answers proxies of ``proxy_namespace`` as those of every other namespace
        this is true of: it is not the root namespace, has no rules of its own, and no exported rule
        names the namespaces it is exported to (``*`` or the mesh default, as most rules are)."""
        if proxy_namespace == self.root_namespace or proxy_namespace in self._local:
            return False
        if self._targeted is None:
            self._targeted = any(
                entry.export_to and visibility.PUBLIC not in entry.export_to
                for rules in self._exported.values()
                for entries in rules.by_host.values()
                for entry in entries
            )
        return not self._targeted

    def lookup(self, proxy_namespace: str, host: str, service_namespace: str) -> list[MergedDestinationRule]:
        """The rule entries for ``host`` as seen by proxies in ``proxy_namespace``.

        The proxy's own namespace comes first (for the root namespace, only its
        private rules, so its catch-all exported rules do not shadow a
        service's own), then rules exported by the service's namespace, then
        by the root namespace.
        """
        in_root = proxy_namespace == self.root_namespace
        local = self._root_local if in_root else self._local.get(proxy_namespace)
        if local is not None:
            found = local.lookup(host)
            if found:
                return found
        for owner in (service_namespace, self.root_namespace):
            exported = self._exported.get(owner)
            if exported is None:
                continue
            visible = [
                e
                for e in exported.lookup(host)
                if not e.export_to or visibility.PUBLIC in e.export_to or proxy_namespace in e.export_to
            ]
            if visible:
                return visible
        return []
