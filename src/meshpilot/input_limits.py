"""Limits on what clients send, and the parsers of client text that enforce them.

Clients are proxies (the node ID and metadata of an ADS stream) and whoever
reaches the webhooks (AdmissionReview bodies, the annotations of the pods they
carry). Every parser of such text goes through this module, so that a deeply
nested, oversized or numerically absurd value is refused with
``InputRejected`` (a ``ValueError`` naming what was wrong and the limit)
before Python's recursion limit, its 4,300-digit ``int()`` limit or an
unbounded computation turns it into an internal error.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

#: Deepest nesting of objects and lists accepted. protobuf refuses messages nested deeper than 100
#: (its default recursion limit), which bounds node metadata the same way; a pod nests about 15
#: levels, an Envoy config about 30, so honest input stays far below.
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


def check_nesting(value: Any, what: str, limit: int = MAX_NESTING) -> None:
    """Refuse ``value`` (decoded JSON or YAML) if it nests deeper than ``limit``; iterative, so any
    depth can be measured."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            raise InputRejected(f"{what}: nested deeper than {limit} levels")
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))


def _check_size(text: str, what: str, max_chars: int) -> None:
    if len(text) > max_chars:
        raise InputRejected(f"{what}: {len(text)} characters, at most {max_chars}")


def load_json(text: str, what: str, max_chars: int = MAX_ANNOTATION_CHARS) -> Any:
    """``json.loads`` of client text within the size and nesting limits."""
    _check_size(text, what, max_chars)
    try:
        value = json.loads(text)
    except RecursionError:
        raise InputRejected(f"{what}: nested deeper than {MAX_NESTING} levels") from None
    except ValueError as err:  # JSONDecodeError, and int() past its digit limit
        raise InputRejected(f"{what}: not valid JSON: {err}") from None
    check_nesting(value, what)
    return value


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases (expanding them is the "billion laughs" bomb) and with
    the nesting limit checked as nodes are composed (its composer recurses once per level)."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise InputRejected("YAML aliases are not accepted")
        self._depth += 1
        try:
            if self._depth > MAX_NESTING:
                raise InputRejected(f"nested deeper than {MAX_NESTING} levels")
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
