"""Label values of a plain-integer metric family, checked as prometheus-client checks them."""

from __future__ import annotations

from collections.abc import Sequence


def label_key(
    name: str, labelnames: Sequence[str], values: Sequence[str], named: dict[str, str]
) -> tuple[str, ...]:
    """The child's key: the values by position or by name (not both), one for each label."""
    if values and named:
        raise ValueError("label values by position or by name, not both")
    if not labelnames or (set(named) != set(labelnames) if named else len(values) != len(labelnames)):
        raise ValueError(f"{name} takes the labels {list(labelnames)}")
    return tuple(str(named[n]) for n in labelnames) if named else tuple(str(v) for v in values)
