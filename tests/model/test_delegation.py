"""Delegate VirtualServices merged into their roots, as istiod merges them."""

from __future__ import annotations

from typing import Any

from support.kube import istio
from support.mesh_objects import CLIENT, mesh_objects
from support.model import build

from meshpilot.model.config import ConfigKey
from meshpilot.model.kind import Kind


def _root(http: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return istio("VirtualService", "root", "default", {"hosts": ["reviews"], "http": http, **extra})


def _delegate(http: list[dict[str, Any]], name: str = "leaf", namespace: str = "default", **extra: Any):
    return istio("VirtualService", name, namespace, {"http": http, **extra})


def _dest(subset: str) -> list[dict[str, Any]]:
    return [{"destination": {"host": "reviews", "subset": subset}}]


def _merged(*docs: dict[str, Any]) -> Any:
    model = build([*mesh_objects(), *docs])
    [entry] = [vs for vs in model.push.virtual_services if vs.config.name == "root"]
    return model, entry


def test_delegate_routes_replace_the_root_route_narrowed_by_its_match() -> None:
    root = _root(
        [
            {"name": "api", "match": [{"uri": {"prefix": "/api"}}], "delegate": {"name": "leaf"}},
            {"name": "rest", "route": _dest("v1")},
        ],
        # Root-only settings the delegate routes inherit when they leave them unset.
    )
    root["spec"]["http"][0]["timeout"] = "7s"
    leaf = _delegate(
        [
            {"name": "v2", "match": [{"uri": {"prefix": "/api/v2"}}], "route": _dest("v2"), "timeout": "1s"},
            {"route": _dest("v1")},
        ]
    )
    _, entry = _merged(root, leaf)
    http = entry.config.spec.http
    assert [r.name for r in http] == ["api-v2", "api", "rest"]
    assert [m.uri.prefix for m in http[0].match] == ["/api/v2"]
    assert http[0].timeout.seconds == 1, "the delegate's own setting wins"
    assert [m.uri.prefix for m in http[1].match] == ["/api"], (
        "an unmatched delegate route takes the root's match"
    )
    assert http[1].timeout.seconds == 7, "unset settings come from the root"
    assert not any(r.HasField("delegate") for r in http)
    assert entry.delegates == frozenset({ConfigKey(Kind.VIRTUAL_SERVICE, "leaf", "default")})


def test_headers_merge_and_conflicting_delegate_routes_are_dropped() -> None:
    root = _root(
        [
            {
                "match": [{"uri": {"prefix": "/api"}, "headers": {"x-team": {"exact": "a"}}}],
                "delegate": {"name": "leaf"},
            }
        ]
    )
    leaf = _delegate(
        [
            {"match": [{"uri": {"prefix": "/other"}}], "route": _dest("v2")},  # outside /api: conflict
            {"match": [{"headers": {"x-team": {"exact": "b"}}}], "route": _dest("v2")},  # conflict
            {"match": [{"headers": {"x-user": {"exact": "u"}}}], "route": _dest("v1")},
        ]
    )
    _, entry = _merged(root, leaf)
    [route] = entry.config.spec.http
    [match] = route.match
    assert match.uri.prefix == "/api"
    assert {k: v.exact for k, v in match.headers.items()} == {"x-team": "a", "x-user": "u"}


def test_regex_root_matches_admit_no_narrower_delegate_match() -> None:
    root = _root([{"match": [{"uri": {"regex": "/a.*"}}], "delegate": {"name": "leaf"}}])
    leaf = _delegate([{"match": [{"uri": {"prefix": "/a"}}], "route": _dest("v1")}])
    _, entry = _merged(root, leaf)
    assert list(entry.config.spec.http) == []


def test_missing_or_unexported_delegate_drops_only_its_route() -> None:
    root = _root(
        [
            {"match": [{"uri": {"prefix": "/gone"}}], "delegate": {"name": "missing"}},
            {"match": [{"uri": {"prefix": "/hidden"}}], "delegate": {"name": "hidden", "namespace": "other"}},
            {"name": "rest", "route": _dest("v1")},
        ]
    )
    hidden = _delegate([{"route": _dest("v2")}], name="hidden", namespace="other", exportTo=["."])
    _, entry = _merged(root, hidden)
    assert [r.name for r in entry.config.spec.http] == ["rest"]
    assert ConfigKey(Kind.VIRTUAL_SERVICE, "missing", "default") in entry.delegates


def test_delegates_are_not_virtual_services_of_their_own_and_their_changes_reach_the_root() -> None:
    root = _root([{"match": [{"uri": {"prefix": "/api"}}], "delegate": {"name": "leaf"}}])
    model, entry = _merged(root, _delegate([{"route": _dest("v1")}]))
    assert "leaf" not in [vs.config.name for vs in model.push.virtual_services]
    _, changed = _merged(root, _delegate([{"route": _dest("v2")}]))
    assert entry.config.spec_hash != changed.config.spec_hash
    # A proxy whose scope holds the root depends on the delegate: its change pushes it.
    scope = model.proxy(CLIENT).sidecar_scope
    assert scope is not None
    assert scope.depends_on(ConfigKey(Kind.VIRTUAL_SERVICE, "leaf", "default"), "istio-system")
    assert not scope.depends_on(ConfigKey(Kind.VIRTUAL_SERVICE, "unrelated", "default"), "istio-system")
