"""Plain-integer histograms expose exactly what prometheus-client's ``Histogram`` would."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

# Imported for its process-wide setting, as the server has it: no "_created" series (istiod has none).
import meshpilot.server.metrics  # noqa: F401
from meshpilot.server.histograms import PlainHistogram

SIZES = (1, 10000, 1000000, 4000000, 10000000, 40000000)
LATENCIES = (0.01, 0.1, 0.5, 1, 3, 5, 10, 20, 30)


def _exposition(kind: type[Histogram] | type[PlainHistogram]) -> str:
    registry = CollectorRegistry(auto_describe=True)
    sized = kind("pilot_sized", "Sizes by type", ["type"], buckets=SIZES, registry=registry)
    timed = kind("pilot_timed", "Latencies", buckets=LATENCIES, registry=registry)
    # Values on bounds (buckets hold their bound), between them, below the first and past the last.
    for value in (0, 1, 5, 10000, 10001, 1e6, 4e7, 5e7):
        sized.labels(type="eds").observe(value)
    sized.labels("cds").observe(3)
    for value in (0.0, 0.01, 0.011, 0.5, 30, 31):
        timed.observe(value)
    # NaN goes into the sum and into no bucket or count.
    odd = kind("pilot_odd", "NaN and infinities", buckets=LATENCIES, registry=registry)
    for value in (float("nan"), float("inf"), -1.0):
        odd.observe(value)
    kind("pilot_unused", "Never observed", ["type"], buckets=SIZES, registry=registry)
    kind("pilot_quiet", "Never observed, no labels", buckets=LATENCIES, registry=registry)
    return generate_latest(registry).decode()


def test_the_exposition_is_prometheus_clients() -> None:
    assert _exposition(PlainHistogram) == _exposition(Histogram)


def test_misuse_is_refused_as_prometheus_client_refuses_it() -> None:
    labelled = PlainHistogram("pilot_a", "a", ["type"], buckets=SIZES)
    plain = PlainHistogram("pilot_b", "b", buckets=SIZES)
    with pytest.raises(ValueError, match="labelled"):
        labelled.observe(1)
    with pytest.raises(ValueError, match="takes the labels"):
        plain.labels("eds")
    with pytest.raises(ValueError, match="takes the labels"):
        labelled.labels("eds", "extra")
    with pytest.raises(ValueError, match="takes the labels"):
        labelled.labels(type="eds", other="x")
    with pytest.raises(ValueError, match="takes the labels"):
        labelled.labels(kind="eds")
    with pytest.raises(ValueError, match="increasing"):
        PlainHistogram("pilot_c", "c", buckets=(10, 1))
    assert labelled.labels(type="eds") is labelled.labels("eds"), "one child per label values"
