"""sprig's forgiving conversions between Go values (its strval, cast.ToInt and empty)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from meshpilot.webhooks.inject.gotemplate.values import GoStruct, sprint, truth


def strval(value: Any) -> str:
    """sprig's strval: strings as they are, anything else as ``%v``."""
    return value if isinstance(value, str) else sprint(value)


def empty(value: Any) -> bool:
    """sprig's empty: nil, zero numbers, false, and empty strings, lists and maps."""
    if isinstance(value, GoStruct):
        return False
    return not truth(value)


def to_int(value: Any) -> int:
    """cast.ToInt as sprig uses it: numbers truncated, numeric strings parsed, anything else 0."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        for base in (0, 10):
            try:
                return int(text, base)
            except ValueError:
                pass
        return 0
    return 0


def to_float(value: Any) -> float:
    if isinstance(value, (bool, int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return 0.0
    return 0.0


def strslice(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [strval(v) for v in value if v is not None]
    return [strval(value)]
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float64"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "map"
    if isinstance(value, (list, tuple)):
        return "slice"
    if isinstance(value, GoStruct):
        return "ptr"
    if callable(value):
        return "func"
    return "invalid"
