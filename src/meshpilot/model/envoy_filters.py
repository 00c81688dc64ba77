"""Which EnvoyFilter patches apply to a proxy, and in which order, as istiod picks them.

istiod (``PushContext.EnvoyFilters``) looks in the root namespace, then in the proxy's namespace
(once when they are the same). A filter applies when it names no ``targetRefs`` (those attach to
Kubernetes Gateways and waypoints, which meshpilot does not serve) and its ``workloadSelector`` is
absent or a subset of the proxy's labels; a root-namespace filter with a selector therefore applies
to matching workloads of every namespace. The filters are ordered by ``priority``, then root
namespace first, then creation time (a filter without one first, as Go's zero time), then
``name.namespace``. Each patch of each filter is kept, in its filter's order, when its
``match.proxy`` matches: ``proxyVersion`` is a regular expression searched in the node's
``ISTIO_VERSION`` (no version never matches one), and every ``metadata`` entry must equal the node's.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from meshpilot.model.config import Config, ConfigKey
from meshpilot.model.labels import selector_matches
from meshpilot.model.proxy import Proxy

#: istiod does not compile longer ``proxyVersion`` expressions; such a patch matches no proxy.
MAX_PROXY_VERSION_LENGTH = 1024


@dataclass(frozen=True, slots=True)
class SelectedPatch:
    """One ``configPatches`` entry of one EnvoyFilter version; equal entries compare equal."""

    key: ConfigKey
    spec_hash: int
    #: Its position in ``spec.configPatches``.
    index: int
    config: Config = field(compare=False, hash=False, repr=False)

    @property
    def spec(self) -> object:
        return self.config.spec.config_patches[self.index]


@lru_cache(maxsize=1024)
def version_pattern(expression: str) -> re.Pattern[str] | None:
    """``proxyVersion`` compiled; None when it cannot be (too long, or not a valid expression)."""
    if len(expression) > MAX_PROXY_VERSION_LENGTH:
        return None
    try:
        return re.compile(expression)
    except re.error:
        return None


def proxy_matches(patch: object, proxy: Proxy) -> bool:
    """Whether a patch's ``match.proxy`` (if any) matches ``proxy``."""
    if not patch.HasField("match") or not patch.match.HasField("proxy"):  # type: ignore[attr-defined]
        return True
    wanted = patch.match.proxy  # type: ignore[attr-defined]
    if wanted.proxy_version:
        pattern = version_pattern(wanted.proxy_version)
        version = proxy.metadata.istio_version
        if pattern is None or not version or pattern.search(version) is None:
            return False
    raw = proxy.metadata.raw
    return all(raw.get(k) == v for k, v in wanted.metadata.items())


def _created(config: Config) -> str:
    # Go's zero time sorts before every real one; RFC 3339 stamps of one format sort as text.
    return config.meta.creation_timestamp or ""


def _attaches(config: Config, labels: Mapping[str, str]) -> bool:
    spec = config.spec
    if len(spec.targetRefs) > 0:
        return False
    if not spec.HasField("workload_selector"):
        return True
    return selector_matches(spec.workload_selector.labels, labels)


class EnvoyFilterIndex:
    """The snapshot's EnvoyFilters by namespace, and the patches each class of proxy takes."""

    def __init__(self, configs: Iterable[Config], root_namespace: str) -> None:
        self.root_namespace = root_namespace
        self._by_namespace: dict[str, list[Config]] = defaultdict(list)
        metadata_keys: set[str] = set()
        for config in configs:
            self._by_namespace[config.namespace].append(config)
            for patch in config.spec.config_patches:
                metadata_keys.update(patch.match.proxy.metadata.keys())
        #: Node metadata the patches compare: part of the key of a proxy's selection.
        self._metadata_keys = tuple(sorted(metadata_keys))
        self._selections: dict[object, tuple[SelectedPatch, ...]] = {}

    def __bool__(self) -> bool:
        return bool(self._by_namespace)

    def configs_for(self, proxy: Proxy) -> list[Config]:
        """The EnvoyFilters that select ``proxy``, in the order their patches apply."""
        labels = proxy.labels
        namespaces = dict.fromkeys((self.root_namespace, proxy.config_namespace))
        found = [c for ns in namespaces for c in self._by_namespace.get(ns, ()) if _attaches(c, labels)]
        root = self.root_namespace
        return sorted(
            found,
            key=lambda c: (c.spec.priority, c.namespace != root, _created(c), f"{c.name}.{c.namespace}"),
        )

    def patches_for(self, proxy: Proxy) -> tuple[SelectedPatch, ...]:
        """The patches that apply to ``proxy``, in order; () costs two lookups when none can."""
        if proxy.config_namespace not in self._by_namespace and self.root_namespace not in self._by_namespace:
            return ()
        raw = proxy.metadata.raw
        key = (
            proxy.config_namespace,
            frozenset(proxy.labels.items()),
            proxy.metadata.istio_version,
            tuple(raw.get(k) if isinstance(raw.get(k), str) else None for k in self._metadata_keys),
        )
        found = self._selections.get(key)
        if found is None:
            found = tuple(
                SelectedPatch(config.key, config.spec_hash, i, config)
                for config in self.configs_for(proxy)
                for i, patch in enumerate(config.spec.config_patches)
                if proxy_matches(patch, proxy)
            )
            self._selections[key] = found
        return found
