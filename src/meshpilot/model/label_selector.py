"""Kubernetes LabelSelectors (``matchLabels`` and ``matchExpressions``) evaluated against labels."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class SelectorError(ValueError):
    """A selector that cannot be evaluated (an unknown operator, an expression without a key)."""


def label_selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Kubernetes semantics: every term must hold, so an empty selector selects everything."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != str(value):
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if not isinstance(key, str) or not key:
            raise SelectorError(f"label selector expression without a key: {expr!r}")
        if op == "In":
            ok = key in labels and labels[key] in values
        elif op == "NotIn":
            ok = labels.get(key) not in values
        elif op == "Exists":
            ok = key in labels
        elif op == "DoesNotExist":
            ok = key not in labels
        else:
            raise SelectorError(
                f"label selector operator {op!r} is not one of In, NotIn, Exists, DoesNotExist"
            )
        if not ok:
            return False
    return True


def is_empty(selector: Mapping[str, Any]) -> bool:
    return not selector.get("matchLabels") and not selector.get("matchExpressions")
