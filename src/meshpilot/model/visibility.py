"""exportTo: which namespaces see a service or config."""

from __future__ import annotations

from collections.abc import Iterable

PUBLIC = "*"
PRIVATE = "."
NONE = "~"


def export_set(export_to: Iterable[str], default: Iterable[str]) -> frozenset[str]:
    values = frozenset(export_to)
    return values if values else frozenset(default)


def visible_to(export_to: frozenset[str], owner_namespace: str, namespace: str) -> bool:
    """Whether something in ``owner_namespace`` exported to ``export_to`` is seen from ``namespace``."""
    if PUBLIC in export_to:
        return True
    if PRIVATE in export_to and owner_namespace == namespace:
        return True
    return namespace in export_to
