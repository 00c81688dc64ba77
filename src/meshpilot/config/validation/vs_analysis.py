"""Warnings about VirtualService rules and matches that can never be used.

Rules are tried in order, so a rule after a catch-all rule, or a match that
repeats (or is covered by) an earlier one, is dead configuration. These are
warnings: the object is still accepted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from meshpilot.config.validation.formatting import go_quote
from meshpilot.config.validation.report import Report

_EXACT = "exact:"
_PREFIX = "prefix:"


def _unused(report: Report, rule: str, reason: str) -> None:
    report.warn(f"virtualService rule {rule} not used ({reason})")


def _ineffective(report: Report, rule: str, match: str, previous: str) -> None:
    report.warn(
        f"virtualService rule {rule} match {match} is not used "
        f"(duplicate/overlapping match in rule {previous})"
    )


def _http_rule_name(route: Any, index: int) -> str:
    return go_quote(str(route.name)) if route.name else f"#{index}"


def _index_name(_: Any, index: int) -> str:
    # TCP and TLS rules and matches have no names.
    return f"#{index}"


def _http_match_name(match: Any, index: int) -> str:
    return go_quote(str(match.name)) if match.name else f"#{index}"


def _match_key(match: Any) -> bytes:
    """Two matches are duplicates when they are equal apart from their names."""
    if match.DESCRIPTOR.fields_by_name.get("name") is not None and match.name:
        unnamed = type(match)()
        unnamed.CopyFrom(match)  # a copy, so the spec itself is untouched
        unnamed.name = ""
        match = unnamed
    return bytes(match.SerializeToString(deterministic=True))


@dataclass(slots=True)
class _PrefixMatch:
    """An HTTP match on a URI prefix, with what else it matches on, for the overlap check."""

    rule: str
    match: str
    prefix: str
    port: int
    method: str
    authority: str
    headers: dict[str, str] = field(default_factory=dict)
    query_params: dict[str, str] = field(default_factory=dict)
    without_headers: dict[str, str] = field(default_factory=dict)


def _encode(string_match: Any) -> str:
    """exact and prefix matches compare by value; a regex (or nothing) encodes as ""."""
    kind = string_match.WhichOneof("match_type")
    value: str = getattr(string_match, kind) if kind else ""
    if kind == "exact" and value:
        return _EXACT + value
    if kind == "prefix" and value:
        return _PREFIX + value
    return ""


def _prefix_match(rule: str, match_name: str, match: Any) -> _PrefixMatch | None:
    if match.uri.WhichOneof("match_type") != "prefix" or not match.uri.prefix:
        return None
    # A match without a method is taken to be for GET.
    method = _encode(match.method) or _EXACT + "GET"
    return _PrefixMatch(
        rule=rule,
        match=match_name,
        prefix=match.uri.prefix,
        port=match.port,
        method=method,
        authority=_encode(match.authority),
        headers={k: _encode(v) for k, v in match.headers.items()},
        query_params={k: _encode(v) for k, v in match.query_params.items()},
        without_headers={k: _encode(v) for k, v in match.without_headers.items()},
    )


def _value_covers(earlier: str, later: str) -> bool:
    return earlier == later or earlier.startswith(later)


def _map_covers(earlier: dict[str, str], later: dict[str, str]) -> bool:
    if len(earlier) != len(later):
        return False
    return all(k in later and _value_covers(v, later[k]) for k, v in earlier.items())


def _covers(earlier: _PrefixMatch, later: _PrefixMatch) -> bool:
    """Whether ``earlier`` matches every request ``later`` matches (istiod's approximation)."""
    return (
        later.prefix.startswith(earlier.prefix)
        and earlier.port == later.port
        and _value_covers(earlier.method, later.method)
        and _value_covers(earlier.authority, later.authority)
        and _map_covers(earlier.headers, later.headers)
        and _map_covers(earlier.query_params, later.query_params)
        and _map_covers(earlier.without_headers, later.without_headers)
    )


def _analyze(
    routes: Sequence[Any],
    rule_name: Callable[[Any, int], str],
    match_name: Callable[[Any, int], str],
    report: Report,
    prefixes: list[_PrefixMatch] | None = None,
) -> None:
    seen: dict[bytes, int] = {}
    catch_all_at = -1
    for index, route in enumerate(routes):
        name = rule_name(route, index)
        if not route.match:
            if catch_all_at >= 0:
                _unused(report, name, "only the last rule can have no matches")
            catch_all_at = index
            continue
        duplicates = 0
        for match_index, match in enumerate(route.match):
            if catch_all_at >= 0:
                # Reported once per match, as istiod does.
                _unused(report, name, "route without matches defined before")
                continue
            key = _match_key(match)
            if key in seen:
                earlier = seen[key]
                _ineffective(
                    report, name, match_name(match, match_index), rule_name(routes[earlier], earlier)
                )
                duplicates += 1
                continue
            seen[key] = index
            if prefixes is not None:
                entry = _prefix_match(name, match_name(match, match_index), match)
                if entry is not None:
                    prefixes.append(entry)
        if duplicates == len(route.match):
            _unused(report, name, "all matches used by prior rules")


def warn_unreachable_rules(vs: Any, report: Report) -> None:
    """Warn about rules and matches of a VirtualService that no request can reach."""
    prefixes: list[_PrefixMatch] = []
    _analyze(vs.http, _http_rule_name, _http_match_name, report, prefixes)
    for i, earlier in enumerate(prefixes):
        for later in prefixes[i + 1 :]:
            # Equal prefixes were already handled as duplicates (or differ elsewhere).
            if later.prefix == earlier.prefix or not _covers(earlier, later):
                continue
            _ineffective(
                report,
                later.rule,
                f"{later.match} of prefix {later.prefix}",
                f"{earlier.match} of prefix {earlier.prefix} on {earlier.rule}",
            )
    _analyze(vs.tcp, _index_name, _index_name, report)
    _analyze(vs.tls, _index_name, _index_name, report)
