"""Durations, percentages and weights."""

from __future__ import annotations

from typing import Any

from meshpilot.config.validation.formatting import go_float

_MILLISECOND = 1_000_000
_INT64_MAX = 2**63 - 1
_INT64_MIN = -(2**63)


def duration_nanos(duration: Any) -> int:
    """A google.protobuf.Duration in nanoseconds, saturating at int64 like Go's AsDuration."""
    nanos = int(duration.seconds) * 1_000_000_000 + int(duration.nanos)
    return max(_INT64_MIN, min(_INT64_MAX, nanos))


def validate_duration(duration: Any) -> str | None:
    """At least 1ms, in whole milliseconds. An unset duration counts as zero."""
    nanos = duration_nanos(duration) if duration is not None else 0
    if nanos < _MILLISECOND:
        return "duration must be greater than 1ms"
    if nanos % _MILLISECOND:
        return "only durations to ms precision are supported"
    return None


def validate_percent(value: int) -> str | None:
    """An integer percentage in 0..100."""
    if 0 <= value <= 100:
        return None
    return f"percentage {value} is not in range 0..100"


def validate_percentage(percent: Any) -> str | None:
    """A Percent message: 0, or between 0.0001 and 100."""
    value = float(percent.value)
    if value < 0.0 or value > 100.0 or 0.0 < value < 0.0001:
        return f"percentage {go_float(value)} is neither 0.0, nor in range [0.0001, 100.0]"
    return None


def validate_weight(weight: int) -> str | None:
    """A route weight is not negative."""
    return f"weight {weight} < 0" if weight < 0 else None
