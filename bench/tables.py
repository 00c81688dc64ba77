"""Markdown tables for docs/benchmarks.md: how a figure is printed, and how a result is looked up."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value >= 100:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}"
    return str(value)


def table(header: list[str], rows: Iterable[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return [*out, ""]


def get(data: dict[str, Any], *path: str) -> Any:
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


# -- goals -----------------------------------------------------------------------------


def counts(values: dict[str, float] | None) -> str:
    """'cds 400, lds 400' from {'type="cds"': 400, ...}."""
    items = sorted((k.split('"')[1] if '"' in k else k, int(v)) for k, v in (values or {}).items())
    return ", ".join(f"{k} {v}" for k, v in items) or "none"
