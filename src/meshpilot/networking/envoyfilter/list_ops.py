"""ADD, INSERT_FIRST, INSERT_BEFORE, INSERT_AFTER, REPLACE and REMOVE on an ordered list of filters,
as istiod carries them out (listener filters, network filters and HTTP filters alike).

Without a match on the element (``has_match`` False), INSERT_BEFORE inserts first and INSERT_AFTER
last, while REPLACE and REMOVE do nothing. With one, INSERT_* and REPLACE act at the first element
that matches, REMOVE removes every one, and nothing happens when none does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from meshpilot.networking.envoyfilter.patches import Operation, Patch

T = TypeVar("T")

#: The operations that act where the element match points.
_AT_MATCH = (Operation.INSERT_BEFORE, Operation.INSERT_AFTER, Operation.REPLACE, Operation.REMOVE)


def apply(
    items: list[Any], patch: Patch, has_match: bool, matches: Callable[[Any], bool]
) -> list[Any] | None:
    """The list with the patch's operation applied; None when it does not change the list."""
    op = patch.operation
    if op == Operation.ADD:
        return [*items, patch.copy_value()]
    if op == Operation.INSERT_FIRST:
        return [patch.copy_value(), *items]
    if op == Operation.INSERT_BEFORE and not has_match:
        return [patch.copy_value(), *items]
    if op == Operation.INSERT_AFTER and not has_match:
        return [*items, patch.copy_value()]
    if not has_match or op not in _AT_MATCH:
        return None
    if op == Operation.REMOVE:
        kept = [item for item in items if not matches(item)]
        return kept if len(kept) != len(items) else None
    at = first(items, matches)
    if at is None:
        return None
    if op == Operation.REPLACE:
        return [*items[:at], patch.copy_value(), *items[at + 1 :]]
    if op == Operation.INSERT_AFTER:
        at += 1
    return [*items[:at], patch.copy_value(), *items[at:]]


def first(items: list[T], matches: Callable[[T], bool]) -> int | None:
    for i, item in enumerate(items):
        if matches(item):
            return i
    return None


def replace_all(field: Any, items: list[Any]) -> None:
    """Make a repeated message field hold ``items`` (copies are taken, so items may come from it)."""
    copies = []
    for item in items:
        copy = type(item)()
        copy.CopyFrom(item)
        copies.append(copy)
    del field[:]
    field.extend(copies)
