"""Limits on what clients send, and the parsers of client text that enforce them.

Clients are proxies (the node ID and metadata of an ADS stream) and whoever
reaches the webhooks (AdmissionReview bodies, the annotations of the pods they
carry). Every parser of such text goes through this module, so that a deeply
nested, oversized or numerically absurd value is refused with
``InputRejected`` (a ``ValueError`` naming what was wrong and the limit)
before Python's recursion limit, its 4,300-digit ``int()`` limit or an
unbounded computation turns it into an internal error.

Nesting and aliases: one rule, two callers. ``MAX_NESTING`` and
``measure_nesting`` bound decoded values here and the documents of config
files (``config/file_limits.py``). The two differ only in what YAML aliases
may do, on purpose:

- Client input refuses aliases outright (``load_yaml``, while composing). No
  honest client sends them (the API server sends JSON; an annotation is a
  short value written by hand or by a tool), the parse runs on the serving
  loop with no other bound on its time or memory, and refusing costs nothing.
- Config files bound them (``FileLimits.max_alias_values``). People write
  anchors and merge keys in hand-kept config, so refusing them would break
  files istiod accepts; and a file is parsed in the loader process, under its
  own time and memory limits, so parsing one with aliases first and counting
  what they add afterwards is safe.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import yaml

#: Deepest nesting of objects and lists accepted, in client input and config files alike (a scalar
#: is 0 levels, ``[1]`` is 1). protobuf refuses messages nested deeper than 100 (its default
#: recursion limit), which bounds node metadata the same way; a pod nests about 15 levels, an Envoy
#: config in an EnvoyFilter patch a few dozen, so honest input stays far below. Python's recursion
#: limit (1,000) and libyaml's (1,000 levels) are well above, so every recursive decoder fails here
#: first, with a message, and not with a RecursionError.
MAX_NESTING = 100
#: ``TYPE~IP~POD.NS~NS.svc.DOMAIN``: a DNS name (253), a namespace (63), a pod name (253) and an IP
#: fit in less; a longer ID names no workload.
MAX_NODE_ID_CHARS = 1024
#: JSON carried in one node metadata value (``POD_PORTS``): a pod's ports are a few KB at most.
MAX_METADATA_JSON_CHARS = 64 * 1024
#: Kubernetes' limit on all the annotations of one object together (TotalAnnotationSizeLimitB).
MAX_ANNOTATION_CHARS = 256 * 1024
#: Digits and suffix of one number written as text (a quantity, a port, a duration). Honest values
#: have under 30; past 4,300 digits Python's int() raises, and exponents make arithmetic unbounded.
MAX_NUMBER_CHARS = 64


class InputRejected(ValueError):
    """Client input over a limit or not parseable; the message says which and what it was."""


class NestingExceeded(ValueError):
    """A decoded value over the nesting or alias limit; the message names the limit."""


def too_deep(limit: int) -> str:
    """The one wording of a nesting refusal, wherever it is found."""
    return f"nested deeper than the limit of {limit} levels"


def measure_nesting(value: Any, max_levels: int = MAX_NESTING, max_alias_values: int | None = None) -> None:
    """Raise ``NestingExceeded`` if ``value`` (decoded JSON or YAML) nests deeper than
    ``max_levels`` or, when ``max_alias_values`` is set, if containers used more than once (what
    YAML aliases and merge keys make) add more than that many values when expanded.

    Iterative, so any depth can be measured without meeting Python's recursion limit. Each
    container is walked once: a second use adds its remembered size and depth, so an alias bomb
    costs its parsed size, not the expanded one. Values count as in the expansion: a container 1,
    and each key and value in it. A container inside itself (a recursive alias) is refused.
    """
    if not isinstance(value, dict | list):
        return
    if max_levels < 1:
        raise NestingExceeded(too_deep(max_levels))
    #: id of a finished container -> (values under it, expanded; its levels).
    done: dict[int, tuple[int, int]] = {}
    #: The containers being walked, outermost first: [container, its children, values, levels].
    path: list[list[Any]] = [[value, _children(value), 1 + _key_count(value), 0]]
    open_ids = {id(value)}
    added = 0
    while path:
        frame = path[-1]
        child = next(frame[1], _END)
        if child is _END:
            path.pop()
            open_ids.discard(id(frame[0]))
            size, levels = frame[2], frame[3] + 1
            done[id(frame[0])] = (size, levels)
            if path:
                parent = path[-1]
                parent[2] += size
                parent[3] = max(parent[3], levels)
            continue
        if not isinstance(child, dict | list):
            frame[2] += 1
            continue
        depth = len(path) + 1
        key = id(child)
        seen = done.get(key)
        if seen is not None:
            # A second use of a container: an alias (or a merge key) put it here again.
            size, levels = seen
            if depth + levels - 1 > max_levels:
                raise NestingExceeded(too_deep(max_levels))
            added += size
            if max_alias_values is not None and added > max_alias_values:
                raise NestingExceeded(
                    f"YAML aliases expand it by more than the limit of {max_alias_values:,} values"
                )
            frame[2] += size
            frame[3] = max(frame[3], levels)
            continue
        if key in open_ids:
            raise NestingExceeded("a YAML alias refers to a node that contains it")
        if depth > max_levels:
            raise NestingExceeded(too_deep(max_levels))
        open_ids.add(key)
        path.append([child, _children(child), 1 + _key_count(child), 0])


_END = object()


def _children(container: dict[Any, Any] | list[Any]) -> Iterator[Any]:
    return iter(container.values() if isinstance(container, dict) else container)


def _key_count(container: dict[Any, Any] | list[Any]) -> int:
    # Keys are scalars (YAML and JSON keys are hashable): each is one value of the expansion.
    return len(container) if isinstance(container, dict) else 0


def check_nesting(value: Any, what: str, limit: int = MAX_NESTING) -> None:
    """Refuse ``value`` (decoded JSON or YAML) if it nests deeper than ``limit`` levels."""
    try:
        measure_nesting(value, limit)
    except NestingExceeded as err:
        raise InputRejected(f"{what}: {err}") from None


def _check_size(text: str, what: str, max_chars: int) -> None:
    if len(text) > max_chars:
        raise InputRejected(f"{what}: {len(text)} characters, at most {max_chars}")


def load_json(text: str, what: str, max_chars: int = MAX_ANNOTATION_CHARS) -> Any:
    """``json.loads`` of client text within the size and nesting limits."""
    _check_size(text, what, max_chars)
    try:
        value = json.loads(text)
    except RecursionError:
        raise InputRejected(f"{what}: {too_deep(MAX_NESTING)}") from None
    except ValueError as err:  # JSONDecodeError, and int() past its digit limit
        raise InputRejected(f"{what}: not valid JSON: {err}") from None
    check_nesting(value, what)
    return value


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases (see the module's docstring) and with the nesting limit
    checked as nodes are composed: its composer recurses once per level, so the limit must hold
    before there is a value for ``measure_nesting`` to measure."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise InputRejected("YAML aliases are not accepted")
        if not self.check_event(yaml.CollectionStartEvent):
            return super().compose_node(parent, index)  # a scalar: no level, no recursion
        self._depth += 1
        try:
            if self._depth > MAX_NESTING:
                raise InputRejected(too_deep(MAX_NESTING))
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load_yaml(text: str, what: str, max_chars: int = MAX_ANNOTATION_CHARS) -> Any:
    """One YAML (or JSON) document of client text within the size and nesting limits, no aliases."""
    _check_size(text, what, max_chars)
    loader: _BoundedLoader | None = None
    try:
        loader = _BoundedLoader(text)  # its reader already refuses unprintable characters
        return loader.get_single_data()
    except InputRejected as err:
        raise InputRejected(f"{what}: {err}") from None
    except (yaml.YAMLError, ValueError) as err:  # ValueError: a scalar int() refuses
        raise InputRejected(f"{what}: not valid YAML or JSON: {err}") from None
    finally:
        if loader is not None:
            loader.dispose()


def check_number_text(text: str, what: str) -> None:
    """Refuse a number written with more than MAX_NUMBER_CHARS characters before converting it."""
    if len(text) > MAX_NUMBER_CHARS:
        raise InputRejected(f"{what}: a number of {len(text)} characters, at most {MAX_NUMBER_CHARS}")


def is_decimal(text: str) -> bool:
    """Whether ``text`` is an unsigned decimal integer that ``int()`` takes within the limits
    (``str.isdigit`` alone also accepts ``²``, which ``int()`` refuses, and any length)."""
    return len(text) <= MAX_NUMBER_CHARS and text.isascii() and text.isdigit()
