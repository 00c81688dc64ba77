"""DestinationRules indexed by host, merged and looked up as istiod does."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from meshpilot.model import visibility
from meshpilot.model.config import Config
from meshpilot.model.confighash import hash_value
from meshpilot.model.hosts import most_specific_match, resolve_short_name


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
    #: Stable hash of the contributing configs: part of the cache keys of what reads the rule.
    fingerprint: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        parts = tuple((str(c.key), c.spec_hash) for c in self.configs)
        object.__setattr__(self, "fingerprint", hash_value((self.host, parts)))

    @property
    def traffic_policy(self) -> Any | None:
        for config in self.configs:
            if config.spec.HasField("traffic_policy"):
                return config.spec.traffic_policy
        return None

    @property
    def subsets(self) -> list[Any]:
        seen: set[str] = set()
        out = []
        for config in self.configs:
            for subset in config.spec.subsets:
                if subset.name not in seen:
                    seen.add(subset.name)
                    out.append(subset)
        return out

    def subset(self, name: str) -> Any | None:
        for subset in self.subsets:
            if subset.name == name:
                return subset
        return None

    @property
    def first(self) -> Config:
        return self.configs[0]


class _HostRules:
    def __init__(self) -> None:
        self.by_host: dict[str, list[Config]] = defaultdict(list)

    def add(self, host: str, config: Config) -> None:
        self.by_host[host].append(config)

    def lookup(self, host: str) -> list[Config]:
        match = most_specific_match(host, list(self.by_host))
        return self.by_host[match] if match is not None else []


class DestinationRuleIndex:
    """Rules local to each namespace and rules each namespace exports."""

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
        self._export_to: dict[tuple[str, str], frozenset[str]] = {}
        default = frozenset(default_export_to)
        for config in configs:
            spec = config.spec
            if spec.HasField("workload_selector"):
                # Workload-scoped rules apply only to selected workloads; not indexed here.
                continue
            host = resolve_short_name(spec.host, config.namespace, domain_suffix)
            export_to = visibility.export_set(spec.export_to, default)
            self._export_to[(config.namespace, config.name)] = export_to
            if visibility.visible_to(export_to, config.namespace, config.namespace):
                self._local[config.namespace].add(host, config)
            if export_to - {visibility.PRIVATE, config.namespace}:
                self._exported[config.namespace].add(host, config)

    def lookup(self, proxy_namespace: str, host: str, service_namespace: str) -> MergedDestinationRule | None:
        """The rule for ``host`` as seen by proxies in ``proxy_namespace``.

        Rules in the proxy's own namespace come first, then rules exported by
        the service's namespace, then by the root namespace.
        """
        local = self._local.get(proxy_namespace)
        if local is not None:
            found = local.lookup(host)
            if found:
                return self._merged(host, found)
        for owner in (service_namespace, self.root_namespace):
            exported = self._exported.get(owner)
            if exported is None:
                continue
            found = [
                c
                for c in exported.lookup(host)
                if visibility.visible_to(self._export_to[(c.namespace, c.name)], c.namespace, proxy_namespace)
            ]
            if found:
                return self._merged(host, found)
        return None

    def _merged(self, host: str, configs: list[Config]) -> MergedDestinationRule:
        export_to = self._export_to[(configs[0].namespace, configs[0].name)]
        return MergedDestinationRule(host, tuple(configs), export_to)
