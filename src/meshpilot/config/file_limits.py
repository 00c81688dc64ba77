"""How much one config file may hold, and the check of a parsed document against it.

Files come from whoever can write to the config directory (a ConfigMap, a git
sync), so a file must not be able to take the server down. Each limit stops
one way a small or odd file becomes a large cost:

- ``max_bytes``: reading and parsing are linear in the size, but a YAML
  document's objects take 10-20 times its text in memory.
- ``max_documents``: every document becomes an object the server keeps.
- ``max_alias_values``: a YAML alias shares a node, and decoding copies it
  each time it is used. Nine lines of "billion laughs" decode to 10^9 values
  (the parse itself stays small). What aliases add is counted without
  expanding anything.
- ``max_depth``: the decoders recurse once per level; libyaml stops at 1,000
  levels, Python's stack at about the same, so a bound well below keeps the
  error a rejection instead of a RecursionError. Istio objects are a few
  levels deep; an EnvoyFilter patch holding a whole Envoy filter config a few
  dozen.
- ``seconds``: what the other limits miss (a slow decoder path) is cut off by
  time: the loader process is stopped and the file rejected.
- ``memory_bytes``: the loader process's address space beyond what it had at
  start, so that anything still missed fails there and not in the server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meshpilot.config.errors import ConfigError

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class FileLimits:
    #: 16 MiB: five times a file of 10,000 ServiceEntries; a ConfigMap holds at most 1 MiB.
    max_bytes: int = 16 * MIB
    #: Objects in a file (YAML documents and the items of ``kind: List`` documents).
    max_documents: int = 50_000
    #: Values that aliases may add to one document (beyond those written out).
    max_alias_values: int = 100_000
    #: Nesting levels of one document (a scalar at the top is level 1).
    max_depth: int = 100
    #: Time to read and decode one file (a file of 10,000 ServiceEntries takes about 3 s).
    seconds: float = 30.0
    #: Memory the loader process may take beyond its start (its address space limit).
    memory_bytes: int = 1024 * MIB


DEFAULT_LIMITS = FileLimits()


class LimitExceeded(ConfigError):
    """A file or document over one of the limits; the message names the limit."""


def check_value(value: Any, limits: FileLimits) -> None:
    """Raise LimitExceeded if ``value`` (a parsed document) nests too deep or aliases too much.

    Shared containers (what YAML aliases make) are measured once and counted
    at each use, so the check costs the parsed size, not the expanded one.
    """
    _Measure(limits).measure(value, 1)


class _Measure:
    def __init__(self, limits: FileLimits) -> None:
        self._limits = limits
        #: id of a container -> (values under it, expanded; levels under it).
        self._done: dict[int, tuple[int, int]] = {}
        self._open: set[int] = set()
        self._added = 0

    def measure(self, value: Any, depth: int) -> tuple[int, int]:
        """(values, levels) of ``value`` at nesting ``depth``; the recursion stops at max_depth."""
        if depth > self._limits.max_depth:
            raise LimitExceeded(f"nested deeper than the limit of {self._limits.max_depth} levels")
        if isinstance(value, dict):
            children: Any = [*value.keys(), *value.values()]
        elif isinstance(value, list):
            children = value
        else:
            return 1, 1
        key = id(value)
        done = self._done.get(key)
        if done is not None:
            # A second use of a container: an alias (or a merge key) put it here again.
            size, levels = done
            if depth + levels - 1 > self._limits.max_depth:
                raise LimitExceeded(f"nested deeper than the limit of {self._limits.max_depth} levels")
            self._added += size
            if self._added > self._limits.max_alias_values:
                limit = self._limits.max_alias_values
                raise LimitExceeded(f"YAML aliases expand it by more than the limit of {limit:,} values")
            return done
        if key in self._open:
            raise LimitExceeded("a YAML alias refers to a node that contains it")
        self._open.add(key)
        size, levels = 1, 0
        for child in children:
            child_size, child_levels = self.measure(child, depth + 1)
            size += child_size
            levels = max(levels, child_levels)
        self._open.discard(key)
        self._done[key] = (size, levels + 1)
        return size, levels + 1
