"""``free_port``'s range: `make test` gives each of its two concurrent pytest runs its own."""

from __future__ import annotations

import pytest

from bench.server import PORT_RANGE_ENV, _ephemeral_floor, _port_range, free_port


def test_ports_come_from_the_range_the_environment_names(monkeypatch: pytest.MonkeyPatch) -> None:
    top = _ephemeral_floor() - 1
    monkeypatch.setenv(PORT_RANGE_ENV, f"{top - 40}-{top - 20}")
    assert _port_range() == (top - 40, top - 20)
    assert all(top - 40 <= free_port() <= top - 20 for _ in range(10))


def test_the_range_stays_below_the_ephemeral_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    top = _ephemeral_floor() - 1
    monkeypatch.setenv(PORT_RANGE_ENV, f"{top - 10}-65535")
    assert _port_range() == (top - 10, top)


@pytest.mark.parametrize("wanted", ["20000", "a-b", "30000-20000", "65000-65535"])
def test_a_bad_range_is_refused_by_name(monkeypatch: pytest.MonkeyPatch, wanted: str) -> None:
    monkeypatch.setenv(PORT_RANGE_ENV, wanted)
    with pytest.raises(ValueError, match=PORT_RANGE_ENV):
        _port_range()


def test_without_it_ports_are_the_twelve_thousand_below_the_ephemeral_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(PORT_RANGE_ENV, raising=False)
    top = _ephemeral_floor() - 1
    assert _port_range() == (max(1024, top - 12000), top)
