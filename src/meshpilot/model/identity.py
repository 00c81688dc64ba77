"""Sameness by identity, for answers kept while what they read is unchanged."""

from __future__ import annotations

import enum
import operator
from collections.abc import Sequence


def same_objects(kept: Sequence[object], now: Sequence[object]) -> bool:
    """Whether ``now`` holds the very objects ``kept`` holds, in order. Model objects are replaced on
    a change, never edited, so the same objects stand for the same content, and asking costs a pointer
    comparison each where comparing values could cost what keeping the answer saves."""
    return len(kept) == len(now) and all(map(operator.is_, kept, now))


class IdentityEnum(enum.Enum):
    """An enum whose members hash by identity, in C.

    ``enum.Enum`` hashes a member by its name in Python code: a dict or set lookup of a key that holds
    one (a memo key naming a proxy's capabilities, a set of updated kinds) then calls into the
    interpreter. Members are singletons compared by identity, so identity's hash is as good, and a
    full push asks such keys about a dozen times per proxy. Like ``hash()`` of a string, the value
    differs between processes: nothing that crosses a process may depend on it."""

    __hash__ = object.__hash__
