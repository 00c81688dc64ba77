"""XdsCache: generated resources by a key of exactly what their generator read.

One LRU per type (CDS, EDS, RDS), each entry remembering the configs it
depends on, so a config change evicts only its dependents. Every write
carries a token, the time the generation started; a write older than the
last eviction is dropped, since it may hold what the eviction removed.

A key that misses an input hands one proxy another's config. With
``UNSAFE_PILOT_ENABLE_RUNTIME_ASSERTIONS`` (istiod's switch for its own
cache assertions) every hit is built again and compared; a difference is
logged with the key and counted (``meshpilot_xds_cache_mismatches``), and
the fresh value is served. For tests and debugging: it costs every hit a build.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from meshpilot.model.config import ConfigKey
from meshpilot.server.metrics import Metrics
from meshpilot.xds.types import TypeUrl

log = logging.getLogger(__name__)

#: istiod's PILOT_XDS_CACHE_SIZE default.
DEFAULT_SIZE = 60000
CACHED_TYPES = (TypeUrl.CLUSTER, TypeUrl.ENDPOINT, TypeUrl.ROUTE)


def assertions_enabled(environ: dict[str, str] | None = None) -> bool:
    """istiod's UNSAFE_PILOT_ENABLE_RUNTIME_ASSERTIONS."""
    value = (environ if environ is not None else os.environ).get("UNSAFE_PILOT_ENABLE_RUNTIME_ASSERTIONS", "")
    return value.strip().lower() in ("1", "true", "yes")


def new_token() -> int:
    """A generation token: now, in the same clock evictions are stamped with."""
    return time.monotonic_ns()


@dataclass(slots=True)
class _Entry:
    value: bytes
    token: int
    dependencies: frozenset[ConfigKey]


class TypedCache:
    """An LRU of serialized resources of one type."""

    def __init__(
        self, capacity: int, metrics: Metrics | None = None, *, type_url: str = "", verify: bool = False
    ) -> None:
        self.capacity = capacity
        self._metrics = metrics
        self._type_url = type_url
        #: Build again on every hit and compare (see the module's docstring).
        self.verify = verify
        self.mismatches = 0
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        #: The reverse index, by dependency set: the proxies of scopes that import the same services
        #: share one set (a route's is every service on its port), so an entry that joins a set
        #: already indexed costs one insertion, not one per config it depends on.
        self._by_dependencies: dict[frozenset[ConfigKey], set[int]] = {}
        self._by_config: dict[ConfigKey, set[frozenset[ConfigKey]]] = {}
        #: Time of the last eviction by a config change; older writes are dropped.
        self._evicted_at = 0
        self._reads = metrics.cache_reads if metrics is not None else None

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: int) -> bytes | None:
        entry = self._entries.get(key)
        reads = self._reads
        if entry is None:
            if reads is not None:
                reads.miss += 1
            return None
        self._entries.move_to_end(key)
        if reads is not None:
            reads.hit += 1
        return entry.value

    def fetch(
        self,
        key: int,
        build: Callable[[], bytes],
        dependencies: Callable[[], frozenset[ConfigKey]],
        token: int,
    ) -> bytes:
        """The value under ``key``, built (and stored with its dependencies) on a miss."""
        value = self.get(key)
        if value is None:
            value = build()
            self.add(key, value, dependencies(), token)
            return value
        if self.verify:
            return self.check(key, value, build())
        return value

    def check(self, key: int, cached: bytes, fresh: bytes) -> bytes:
        """With ``verify``: compare a hit with a fresh build; the fresh value is the one to serve.

        Hot loops call ``get``/``add`` themselves (a closure per resource costs more than the lookup)
        and this on a hit when ``verify`` is set."""
        if fresh != cached:
            self.mismatches += 1
            if self._metrics is not None:
                self._metrics.cache_mismatches.labels(type=TypeUrl(self._type_url).short).inc()
            log.error(
                "xDS cache: the %s entry under key %x differs from a fresh build (%d bytes cached, "
                "%d built): its key misses an input",
                self._type_url,
                key,
                len(cached),
                len(fresh),
            )
        return fresh

    def add(self, key: int, value: bytes, dependencies: frozenset[ConfigKey], token: int) -> bool:
        """Store ``value`` unless the generation that made it predates the last eviction."""
        if token < self._evicted_at:
            return False
        old = self._entries.get(key)
        if old is not None:
            if token <= old.token:
                return False
            self._unindex(key, old.dependencies)
        self._entries[key] = _Entry(value, token, dependencies)
        self._entries.move_to_end(key)
        keys = self._by_dependencies.get(dependencies)
        if keys is not None:
            keys.add(key)
        else:
            self._by_dependencies[dependencies] = {key}
            for config in dependencies:
                self._by_config.setdefault(config, set()).add(dependencies)
        while len(self._entries) > self.capacity:
            evicted_key, evicted = self._entries.popitem(last=False)
            self._unindex(evicted_key, evicted.dependencies)
            if self._metrics is not None:
                self._metrics.cache_evictions.labels(type="size").inc()
        return True

    def clear(self, configs: Iterable[ConfigKey]) -> int:
        """Evict every entry depending on one of ``configs``; returns how many."""
        self._evicted_at = new_token()
        evicted = 0
        for config in configs:
            for dependencies in self._by_config.pop(config, ()):
                for key in self._by_dependencies.pop(dependencies, ()):
                    if self._entries.pop(key, None) is not None:
                        evicted += 1
                self._forget_set(dependencies, skip=config)
        if evicted and self._metrics is not None:
            self._metrics.cache_evictions.labels(type="clear").inc(evicted)
        return evicted

    def clear_all(self) -> None:
        self._evicted_at = new_token()
        if self._entries and self._metrics is not None:
            self._metrics.cache_evictions.labels(type="clear").inc(len(self._entries))
        self._entries.clear()
        self._by_dependencies.clear()
        self._by_config.clear()

    def dependent_config_count(self) -> int:
        return len(self._by_config)

    def _unindex(self, key: int, dependencies: frozenset[ConfigKey]) -> None:
        keys = self._by_dependencies.get(dependencies)
        if keys is None:
            return
        keys.discard(key)
        if not keys:
            del self._by_dependencies[dependencies]
            self._forget_set(dependencies)

    def _forget_set(self, dependencies: frozenset[ConfigKey], skip: ConfigKey | None = None) -> None:
        """Take a dependency set no entry holds any more out of its configs' index (but ``skip``'s,
        already popped)."""
        for config in dependencies:
            if config == skip:
                continue
            sets = self._by_config.get(config)
            if sets is not None:
                sets.discard(dependencies)
                if not sets:
                    del self._by_config[config]


class XdsCache:
    """The caches of the cached types, cleared together."""

    def __init__(
        self, size: int = DEFAULT_SIZE, metrics: Metrics | None = None, *, verify: bool = False
    ) -> None:
        self._metrics = metrics
        #: Build again what a hit returns and compare (see the module's docstring); generators that
        #: keep answers elsewhere check them too and report a difference with ``mismatch``.
        self.verify = verify
        self.types = {
            type_url: TypedCache(size, metrics, type_url=type_url, verify=verify) for type_url in CACHED_TYPES
        }

    def for_type(self, type_url: TypeUrl) -> TypedCache | None:
        return self.types.get(type_url)

    def mismatch(self, type_url: TypeUrl, what: str) -> None:
        """A kept answer of a generator of ``type_url`` differed from a fresh one (``verify``)."""
        if self._metrics is not None:
            self._metrics.cache_mismatches.labels(type=type_url.short).inc()
        log.error("xDS cache: a kept %s of %s differs from a fresh one: it misses an input", what, type_url)

    def clear(self, configs: Iterable[ConfigKey]) -> None:
        keys = frozenset(configs)
        for cache in self.types.values():
            cache.clear(keys)
        self._record_sizes()

    def clear_all(self) -> None:
        for cache in self.types.values():
            cache.clear_all()
        self._record_sizes()

    def _record_sizes(self) -> None:
        if self._metrics is not None:
            self._metrics.cache_size.set(sum(len(c) for c in self.types.values()))
            self._metrics.cache_dependent_configs.set(
                sum(c.dependent_config_count() for c in self.types.values())
            )
