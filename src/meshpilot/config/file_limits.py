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
  expanding anything. (Client input refuses aliases instead; why the two
  differ is said once, in ``meshpilot.input_limits``.)
- ``max_depth``: ``MAX_NESTING``, the one nesting limit of client input and
  config files; ``measure_nesting`` (shared with client input, iterative)
  checks it together with the aliases, before any decoder recurses.
- ``seconds``: what the other limits miss (a slow decoder path) is cut off by
  time: the loader process is stopped and the file rejected.
- ``memory_bytes``: the loader process's address space beyond what it had at
  start, so that anything still missed fails there and not in the server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meshpilot.config.errors import ConfigError
from meshpilot.input_limits import MAX_NESTING, NestingExceeded, measure_nesting

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class FileLimits:
    #: 16 MiB: five times a file of 10,000 ServiceEntries; a ConfigMap holds at most 1 MiB.
    max_bytes: int = 16 * MIB
    #: Objects in a file (YAML documents and the items of ``kind: List`` documents).
    max_documents: int = 50_000
    #: Values that aliases may add to one document (beyond those written out).
    max_alias_values: int = 100_000
    #: Nesting levels of objects and lists in one document (``{"a": [1]}`` is 2).
    max_depth: int = MAX_NESTING
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
    try:
        measure_nesting(value, limits.max_depth, limits.max_alias_values)
    except NestingExceeded as err:
        raise LimitExceeded(str(err)) from None
