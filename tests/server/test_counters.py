"""Plain-integer counters expose exactly what prometheus-client's ``Counter`` would, renamed alike."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter

from meshpilot.server.counters import PlainCounter

# Also for its process-wide setting, as the server has it: no "_created" series (istiod has none),
# without which prometheus-client's counters would expose one that these do not.
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


@pytest.mark.parametrize("kind", [PlainCounter, Counter])
def test_misuse_is_refused_as_prometheus_client_refuses_it(kind: type[Counter] | type[PlainCounter]) -> None:
    labelled = kind("pilot_a", "a", ["type"])
    plain = kind("pilot_b", "b")
    # Each refusal as either says it.
    with pytest.raises(ValueError, match=r"is labelled|missing label values"):
        labelled.inc()
    with pytest.raises(ValueError, match=r"takes the labels|No label names"):
        plain.labels("eds")
    with pytest.raises(ValueError, match=r"takes the labels|Incorrect label count"):
        labelled.labels("eds", "extra")
    with pytest.raises(ValueError, match=r"takes the labels|Incorrect label names"):
        labelled.labels(kind="eds")
    with pytest.raises(ValueError, match="non-negative"):
        plain.inc(-1)
    with pytest.raises(ValueError, match="non-negative"):
        labelled.labels("eds").inc(-1)
    assert labelled.labels(type="eds") is labelled.labels("eds"), "one child per label values"
