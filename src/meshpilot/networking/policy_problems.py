"""Problems met while turning security policies into Envoy config, logged and counted by object.

A rule istiod skips, a CUSTOM policy whose provider cannot be used, a JWKS that cannot be fetched:
each changes what a proxy enforces, so none may pass in silence. Each distinct problem (object and
message) is logged once at warning level, and every occurrence is counted in
``meshpilot_policy_problems_total{kind,name}`` (``name`` is ``namespace/name``).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

_LOGGED_LIMIT = 10000


class PolicyProblems(Collector):
    """A tally of problems by object, readable as Prometheus metrics (policy problems by default)."""

    def __init__(
        self,
        metric: str = "meshpilot_policy_problems",
        documentation: str = "Security policy problems met while generating Envoy config (meshpilot only).",
    ) -> None:
        self._metric = metric
        self._documentation = documentation
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str]] = Counter()
        self._logged: set[tuple[str, str, str]] = set()

    def record(self, kind: str, name: str, message: str) -> None:
        """One occurrence of ``message`` about the ``kind`` object ``name`` (``namespace/name``)."""
        with self._lock:
            self._counts[(kind, name)] += 1
            key = (kind, name, message)
            if key in self._logged:
                return
            if len(self._logged) >= _LOGGED_LIMIT:
                self._logged.clear()
            self._logged.add(key)
        log.warning("%s %s: %s", kind, name, message)

    def count(self, kind: str, name: str) -> int:
        with self._lock:
            return self._counts[(kind, name)]

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            self._metric,
            self._documentation,
            labels=["kind", "name"],
        )
        with self._lock:
            for (kind, name), value in sorted(self._counts.items()):
                family.add_metric([kind, name], value)
        yield family

    def register(self, registry: CollectorRegistry) -> None:
        registry.register(self)


#: The process's tally; generators are pure functions of their inputs and report here.
PROBLEMS = PolicyProblems()
