"""Field-by-field comparison of meshpilot's xDS resources with istiod's, and the listed differences.

Both sides are protobuf JSON under proto field names (``MessageToDict(preserving_proto_field_name=True)``
in Python, ``protojson`` with ``UseProtoNames`` in Go). A difference is a path and the two values;
paths name list elements by their ``name`` where they have one, so a rule reads as what it is about:

    listeners[virtualOutbound].filter_chains[0].filters[envoy.filters.network.tcp_proxy].typed_config

A rule of ``tests/reference/fidelity.yaml`` explains the differences whose path matches one of its
patterns: ``*`` stands for any text without brackets (one name, or a run of fields), ``**`` for any
text at all, and everything else is literal. What no rule explains fails the comparison. Named list
elements are matched by name; when the names both sides share come in another order, that is a
difference too (path ``<list>(order)``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

MISSING = "<absent>"
_NAME_KEYS = ("name", "cluster_name")


@dataclass(frozen=True)
class Difference:
    path: str
    istiod: Any
    meshpilot: Any


@dataclass(frozen=True)
class Rule:
    id: str
    paths: tuple[str, ...]
    reason: str
    noticed: str
    cases: tuple[str, ...] = ()
    _compiled: tuple[re.Pattern[str], ...] = field(default=(), compare=False, repr=False)

    def match(self, case: str, path: str) -> str | None:
        """The pattern that explains ``path`` in ``case``, if one does."""
        if self.cases and case not in self.cases:
            return None
        found = (glob for glob, p in zip(self.paths, self._compiled, strict=True) if p.fullmatch(path))
        return next(found, None)


def _pattern(glob: str) -> re.Pattern[str]:
    def within(part: str) -> str:
        return r"[^\[\]]*".join(re.escape(piece) for piece in part.split("*"))

    return re.compile(".*".join(within(part) for part in glob.split("**")))


def load_rules(path: Path) -> list[Rule]:
    rules = []
    for entry in yaml.safe_load(path.read_text()) or []:
        patterns = tuple(entry["paths"])
        rules.append(
            Rule(
                id=entry["id"],
                paths=patterns,
                reason=" ".join(entry["reason"].split()),
                noticed=" ".join(entry["noticed"].split()),
                cases=tuple(entry.get("cases") or ()),
                _compiled=tuple(_pattern(p) for p in patterns),
            )
        )
    ids = [r.id for r in rules]
    assert len(ids) == len(set(ids)), f"duplicate rule ids in {path}"
    return rules


def _key(element: Any, index: int) -> str:
    if isinstance(element, Mapping):
        for key in _NAME_KEYS:
            if isinstance(element.get(key), str):
                return str(element[key])
    return str(index)


def _keyed(items: Sequence[Any]) -> dict[str, Any] | None:
    """A list as {name: element} when its elements have names, else None (compare by index).

    A name that repeats (two RBAC filters, DENY then ALLOW) keys its later elements ``name#2``,
    ``name#3``, so one filter missing on one side does not shift every later element."""
    keyed: dict[str, Any] = {}
    for i, e in enumerate(items):
        key = _key(e, i)
        n = 1
        while (key if n == 1 else f"{key}#{n}") in keyed:
            n += 1
        keyed[key if n == 1 else f"{key}#{n}"] = e
    if all(k == str(i) for i, k in enumerate(keyed)):
        return None
    return keyed


def diff(istiod: Any, meshpilot: Any, path: str = "") -> Iterator[Difference]:
    """Every leaf where the two differ; a subtree present on one side only is one difference."""
    if isinstance(istiod, Mapping) and isinstance(meshpilot, Mapping):
        for key in sorted(set(istiod) | set(meshpilot)):
            sub = f"{path}.{key}" if path else str(key)
            if key not in meshpilot:
                yield Difference(sub, istiod[key], MISSING)
            elif key not in istiod:
                yield Difference(sub, MISSING, meshpilot[key])
            else:
                yield from diff(istiod[key], meshpilot[key], sub)
        return
    if isinstance(istiod, list) and isinstance(meshpilot, list):
        left, right = _keyed(istiod), _keyed(meshpilot)
        if left is not None and right is not None:
            shared = set(left) & set(right)
            order = [n for n in left if n in shared], [n for n in right if n in shared]
            if order[0] != order[1]:
                yield Difference(f"{path}(order)", order[0], order[1])
            yield from diff_named(left, right, path)
            return
        for i in range(max(len(istiod), len(meshpilot))):
            a = istiod[i] if i < len(istiod) else MISSING
            b = meshpilot[i] if i < len(meshpilot) else MISSING
            if a is MISSING or b is MISSING:
                yield Difference(f"{path}[{i}]", a, b)
            else:
                yield from diff(a, b, f"{path}[{i}]")
        return
    if istiod != meshpilot:
        yield Difference(path, istiod, meshpilot)


def diff_named(istiod: Mapping[str, Any], meshpilot: Mapping[str, Any], path: str) -> Iterator[Difference]:
    for name in sorted(set(istiod) | set(meshpilot)):
        sub = f"{path}[{name}]"
        if name not in meshpilot:
            yield Difference(sub, istiod[name], MISSING)
        elif name not in istiod:
            yield Difference(sub, MISSING, meshpilot[name])
        else:
            yield from diff(istiod[name], meshpilot[name], sub)


def by_name(resources: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return {_key(r, i): r for i, r in enumerate(resources)}


@dataclass
class ProxyReport:
    """One proxy of one case: per xDS type, which resources are equal, which differ only as listed."""

    case: str
    proxy: str
    identical: dict[str, int] = field(default_factory=dict)
    explained: dict[str, int] = field(default_factory=dict)
    by_rule: dict[str, int] = field(default_factory=dict)
    #: (rule id, pattern) pairs that explained something here: a pattern never used is stale.
    patterns_used: set[tuple[str, str]] = field(default_factory=set)
    unexplained: list[Difference] = field(default_factory=list)


def compare(
    case: str,
    proxy: str,
    istiod: Mapping[str, Sequence[Any]],
    meshpilot: Mapping[str, Sequence[Any]],
    rules: list[Rule],
) -> ProxyReport:
    report = ProxyReport(case, proxy)
    for kind in ("clusters", "listeners", "routes", "endpoints"):
        ours, theirs = by_name(meshpilot.get(kind) or []), by_name(istiod.get(kind) or [])
        for name in sorted(set(ours) | set(theirs)):
            found = list(diff_named({name: theirs.get(name, MISSING)}, {name: ours.get(name, MISSING)}, kind))
            if name not in ours or name not in theirs:
                found = [Difference(f"{kind}[{name}]", theirs.get(name, MISSING), ours.get(name, MISSING))]
            if not found:
                report.identical[kind] = report.identical.get(kind, 0) + 1
                continue
            all_explained = True
            for difference in found:
                rule, glob = next(
                    ((r, g) for r in rules if (g := r.match(case, difference.path)) is not None), (None, None)
                )
                if rule is None:
                    report.unexplained.append(difference)
                    all_explained = False
                else:
                    report.by_rule[rule.id] = report.by_rule.get(rule.id, 0) + 1
                    report.patterns_used.add((rule.id, str(glob)))
            if all_explained:
                report.explained[kind] = report.explained.get(kind, 0) + 1
    return report
