"""Histograms counted in plain integers, for what a push observes once per proxy.

A push observes five histograms per proxy (push, send, convergence and queue times, config size).
prometheus-client's ``observe`` takes a lock for the sum and another for the bucket it finds by a
linear scan: 1.45-1.6 µs each on the benchmark machine, where this one takes 0.26-0.34 µs, so about
6 µs less per proxy and 12 ms less per push to 2,000 proxies. They are observed on the event loop's
thread only (as ``CacheReads`` is counted), so no lock is needed. The exposition is the same as
prometheus-client's ``Histogram`` (names, help, ``le`` labels and series; a labelled child appears with
its first ``labels()`` call, an unlabelled histogram from the start), which a test compares.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import CollectorRegistry
from prometheus_client.utils import INF, floatToGoString

from meshpilot.server.plain_family import PlainFamily


class HistogramChild:
    """One series: a count per bucket (the last is +Inf) and the sum."""

    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        self.sum += amount
        if amount != amount:  # NaN: in the sum, in no bucket and not counted, as prometheus-client does
            return
        # Buckets hold values up to and including their bound (``le``): the first bound >= amount.
        self.counts[bisect.bisect_left(self._bounds, amount)] += 1


class PlainHistogram(PlainFamily[HistogramChild]):
    """A histogram family, labelled or not, exposed as prometheus-client exposes its ``Histogram``."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry | None = None,
    ) -> None:
        bounds = tuple(float(b) for b in buckets)
        if list(bounds) != sorted(set(bounds)) or INF in bounds:
            raise ValueError(f"{name}: buckets must be finite, distinct and in increasing order")
        super().__init__(name, documentation, labelnames)
        self._bounds = bounds
        self._le = [floatToGoString(b) for b in (*bounds, INF)]  # type: ignore[no-untyped-call]
        self._register(registry)

    def _new_child(self) -> HistogramChild:
        return HistogramChild(self._bounds)

    def observe(self, amount: float) -> None:
        """Observe an unlabelled histogram."""
        self._unlabelled("observe").observe(amount)

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, child in list(self._children.items()):
            cumulative, buckets = 0, []
            for le, count in zip(self._le, child.counts, strict=True):
                cumulative += count
                buckets.append((le, float(cumulative)))
            family.add_metric(list(key), buckets, child.sum)
        yield family
