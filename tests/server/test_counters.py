"""Plain-integer counters expose exactly what prometheus-client's ``Counter`` would, renamed alike."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter

from meshpilot.server.counters import PlainCounter
from meshpilot.server.metrics import exposition


def _exposition(kind: type[Counter] | type[PlainCounter]) -> str:
    registry = CollectorRegistry(auto_describe=True)
    pushes = kind("pilot_pushed", "Pushes by type", ["type"], registry=registry)
    pushes.labels(type="eds").inc()
    pushes.labels("eds").inc(2)
    pushes.labels("cds").inc(0)
    pushes.labels(type="lds").inc(0.5)
    errors = kind("pilot_failed", "Failures", registry=registry)
    errors.inc()
    errors.inc(41)
    kind("pilot_unused", "Never counted", ["type"], registry=registry)
    kind("pilot_quiet", "Never counted, no labels", registry=registry)
    kind("pilot_suffixed_total", "Named with its suffix", registry=registry).inc(3)
    # As the server exposes it: counters under istiod's names, without "_total".
    return exposition(registry).decode()


def test_the_exposition_is_prometheus_clients() -> None:
    plain = _exposition(PlainCounter)
    assert plain == _exposition(Counter)
    assert 'pilot_pushed{type="eds"} 3.0' in plain.splitlines()
    assert "pilot_failed 42.0" in plain.splitlines()


def test_misuse_is_refused_as_prometheus_client_refuses_it() -> None:
    labelled = PlainCounter("pilot_a", "a", ["type"])
    plain = PlainCounter("pilot_b", "b")
    with pytest.raises(ValueError, match="labelled"):
        labelled.inc()
    with pytest.raises(ValueError, match="takes the labels"):
        plain.labels("eds")
    with pytest.raises(ValueError, match="takes the labels"):
        labelled.labels("eds", "extra")
    with pytest.raises(ValueError, match="takes the labels"):
        labelled.labels(kind="eds")
    with pytest.raises(ValueError, match="non-negative"):
        plain.inc(-1)
    with pytest.raises(ValueError, match="non-negative"):
        labelled.labels("eds").inc(-1)
    assert labelled.labels(type="eds") is labelled.labels("eds"), "one child per label values"
