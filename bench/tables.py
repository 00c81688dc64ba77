"""Markdown tables for docs/benchmarks.md: how a figure is printed, and how a result is looked up."""

from __future__ import annotations

import re
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


def fleet_run(
    results: dict[str, Any], scenario: str, variant: str = "compiled", protocol: str = "sotw"
) -> dict[str, Any] | None:
    """The first fleet run of the scenario (or its scaled-down form, "http-200") with the variant and
    protocol. Runs from before delta xDS have no protocol: they were state-of-the-world."""
    for run in results.get("fleet", []):
        if (
            re.fullmatch(rf"{re.escape(scenario)}(-\d+)?", run["scenario"])
            and run["variant"] == variant
            and run.get("protocol", "sotw") == protocol
        ):
            return dict(run)
    return None


def ratio(value: Any, reference: Any) -> str:
    """``value`` over ``reference`` as '0.42x'; '-' where either is missing or the reference is 0."""
    if not isinstance(value, int | float) or not isinstance(reference, int | float) or not reference:
        return "-"
    return f"{value / reference:.2f}x"


def goal_row(
    goal: str, target: float, measured: float | None, unit: str, higher_is_better: bool = False
) -> list[Any]:
    """(goal, target, measured, verdict)."""
    if measured is None:
        return [goal, f"{target:g} {unit}", "not measured", "-"]
    met = measured >= target if higher_is_better else measured <= target
    margin = measured / target if target else 0.0
    verdict = "met" if met else f"missed ({margin:.2f}x the target)"
    return [goal, f"{target:g} {unit}", f"{fmt(measured)} {unit}", verdict]


#: The memory goal of the fleet at the issue's scale, for either protocol's run.
RSS_GOAL_MIB = 1024


def memory_goal_rows(run: dict[str, Any], scale: str) -> list[list[Any]]:
    """Steady and peak RSS against the goal, for one fleet run (``scale``: how the rows name the run)."""
    return [
        goal_row(f"Steady-state RSS ({scale})", RSS_GOAL_MIB, run.get("steady_rss_mib"), "MiB"),
        goal_row(
            f"Peak RSS, including the initial sync ({scale})", RSS_GOAL_MIB, run.get("peak_rss_mib"), "MiB"
        ),
    ]


# -- goals -----------------------------------------------------------------------------


def counts(values: dict[str, float] | None) -> str:
    """'cds 400, lds 400' from {'type="cds"': 400, ...}."""
    items = sorted((k.split('"')[1] if '"' in k else k, int(v)) for k, v in (values or {}).items())
    return ", ".join(f"{k} {v}" for k, v in items) or "none"
