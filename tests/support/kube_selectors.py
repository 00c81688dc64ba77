"""Kubernetes label and field selectors, parsed the way kube-apiserver parses them.

Label selectors: ``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x,y)``, ``a``, ``!a``,
joined by commas (AND). Field selectors: ``metadata.name`` and ``metadata.namespace`` with
``=``, ``==`` or ``!=``, joined by commas.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Predicate = Callable[[Mapping[str, Any]], bool]

_SET_RE = re.compile(r"^([^\s!=]+)\s+(in|notin)\s+\((.*)\)$")
_EQ_RE = re.compile(r"^([^\s!=]+)\s*(==|=|!=)\s*(\S*)$")
_EXISTS_RE = re.compile(r"^(!?)\s*([^\s!=(),]+)$")
_FIELDS = {"metadata.name": "name", "metadata.namespace": "namespace"}


class SelectorError(ValueError):
    """A selector that kube-apiserver would reject with 400 BadRequest."""


def _split_terms(selector: str) -> list[str]:
    """Split on commas that are not inside ``( )``."""
    terms: list[str] = []
    depth, start = 0, 0
    for i, char in enumerate(selector):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            terms.append(selector[start:i])
            start = i + 1
    terms.append(selector[start:])
    return [term.strip() for term in terms if term.strip()]


def _label_term(term: str) -> Callable[[Mapping[str, str]], bool]:
    if m := _SET_RE.match(term):
        key, op = m.group(1), m.group(2)
        values = frozenset(v.strip() for v in m.group(3).split(","))
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if m := _EQ_RE.match(term):
        key, op, value = m.groups()
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if m := _EXISTS_RE.match(term):
        negated, key = m.group(1) == "!", m.group(2)
        return lambda labels: (key in labels) != negated
    raise SelectorError(f"unable to parse requirement: {term!r}")


def label_selector(selector: str) -> Predicate:
    """A predicate on an object (a dict with ``metadata``) for a label selector string."""
    terms = [_label_term(term) for term in _split_terms(selector)]

    def matches(obj: Mapping[str, Any]) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(term(labels) for term in terms)

    return matches


def _field_term(field: str, equal: bool, value: str) -> Callable[[Mapping[str, Any]], bool]:
    return lambda meta: (meta.get(field, "") == value) == equal


#: Top-level fields the API server selects on (a Secret's ``type``; istiod's Secret informer uses it).
_TOP_FIELDS = frozenset({"type"})


def field_selector(selector: str) -> Predicate:
    """A predicate for a field selector string; metadata.name, metadata.namespace and ``type`` are known."""
    terms: list[Callable[[Mapping[str, Any]], bool]] = []
    top: list[Callable[[Mapping[str, Any]], bool]] = []
    for term in _split_terms(selector):
        m = _EQ_RE.match(term)
        if m is not None and m.group(1) in _TOP_FIELDS:
            top.append(_field_term(m.group(1), m.group(2) != "!=", m.group(3)))
            continue
        if m is None or m.group(1) not in _FIELDS:
            raise SelectorError(f"field label not supported: {term!r}")
        terms.append(_field_term(_FIELDS[m.group(1)], m.group(2) != "!=", m.group(3)))

    def matches(obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata", {})
        return all(term(meta) for term in terms) and all(term(obj) for term in top)

    return matches
