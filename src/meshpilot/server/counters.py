"""Counters counted in plain integers, for what a push counts once per proxy.

A push counts per proxy and type what it sent and what it left out (``pilot_xds_pushes``,
``meshpilot_xds_unchanged_skipped``, ``meshpilot_xds_delta_resources_kept``). prometheus-client's
``inc`` takes a lock each time; these are counted on the event loop's thread only (as
``CacheReads`` and ``PlainHistogram`` are), so none is needed. The exposition is prometheus-client's
``Counter``'s (``<name>_total``, which ``metrics.exposition`` renames as it renames theirs; a labelled
child appears with its first ``labels()`` call, an unlabelled counter from the start), which a test
compares.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import CollectorRegistry

from meshpilot.server.plain_family import PlainFamily


class CounterChild:
    """One series."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.value += amount


class PlainCounter(PlainFamily[CounterChild]):
    """A counter family, labelled or not, exposed as prometheus-client exposes its ``Counter``."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        registry: CollectorRegistry | None = None,
    ) -> None:
        # prometheus-client takes the name with or without the suffix and exposes it with one.
        super().__init__(name.removesuffix("_total"), documentation, labelnames)
        self._register(registry)

    def _new_child(self) -> CounterChild:
        return CounterChild()

    def inc(self, amount: float = 1) -> None:
        """Count on an unlabelled counter."""
        self._unlabelled("count").inc(amount)

    def describe(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, child in list(self._children.items()):
            family.add_metric(list(key), child.value)
        yield family
