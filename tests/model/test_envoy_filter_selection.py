"""Which EnvoyFilter patches a proxy takes, in istiod's order (PushContext.EnvoyFilters)."""

from __future__ import annotations

from typing import Any

from support.envoy_filters import config_of, envoy_filter

from meshpilot.model.envoy_filters import EnvoyFilterIndex
from meshpilot.model.proxy import NodeMetadata, Proxy, parse_proxy

NODE = "sidecar~10.1.0.11~productpage-v1.default~default.svc.cluster.local"
PATCH = {"applyTo": "CLUSTER", "patch": {"operation": "REMOVE"}}


def proxy(labels: dict[str, str] | None = None, **metadata: Any) -> Proxy:
    raw = {
        "NAMESPACE": "default",
        "ISTIO_VERSION": "1.28.0",
        "LABELS": labels or {"app": "productpage"},
        **metadata,
    }
    out = parse_proxy(NODE, NodeMetadata.parse(raw))
    return out


def names(index: EnvoyFilterIndex, p: Proxy) -> list[str]:
    return [f"{s.key.namespace}/{s.key.name}" for s in index.patches_for(p)]


def index(*objects: dict[str, Any]) -> EnvoyFilterIndex:
    return EnvoyFilterIndex([config_of(o) for o in objects], "istio-system")


def test_root_namespace_and_own_namespace_filters_apply_others_do_not() -> None:
    found = index(
        envoy_filter("local", "default", [PATCH]),
        envoy_filter("global", "istio-system", [PATCH]),
        envoy_filter("elsewhere", "other", [PATCH]),
    )
    assert names(found, proxy()) == ["istio-system/global", "default/local"]


def test_order_is_priority_then_root_first_then_creation_then_name() -> None:
    found = index(
        envoy_filter("b", "default", [PATCH], created="2024-01-01T00:00:00Z"),
        envoy_filter("a", "default", [PATCH], created="2024-01-01T00:00:00Z"),
        envoy_filter("old", "default", [PATCH], created="2023-01-01T00:00:00Z"),
        envoy_filter("root", "istio-system", [PATCH], created="2025-01-01T00:00:00Z"),
        envoy_filter("early", "default", [PATCH], priority=-1, created="2026-01-01T00:00:00Z"),
        envoy_filter("late", "istio-system", [PATCH], priority=10),
    )
    assert names(found, proxy()) == [
        "default/early",
        "istio-system/root",
        "default/old",
        "default/a",
        "default/b",
        "istio-system/late",
    ]


def test_selectors_and_target_refs() -> None:
    found = index(
        envoy_filter("mine", "default", [PATCH], selector={"app": "productpage"}),
        envoy_filter("theirs", "default", [PATCH], selector={"app": "reviews"}),
        envoy_filter("root-mine", "istio-system", [PATCH], selector={"app": "productpage"}),
        envoy_filter(
            "waypoint",
            "default",
            [PATCH],
            extra={"targetRefs": [{"kind": "Gateway", "group": "gateway.networking.k8s.io", "name": "w"}]},
        ),
    )
    assert names(found, proxy()) == ["istio-system/root-mine", "default/mine"]


def test_proxy_version_and_metadata_matches() -> None:
    def only(match: dict[str, Any]) -> dict[str, Any]:
        return {**PATCH, "match": {"proxy": match}}

    found = index(
        envoy_filter("v128", "default", [only({"proxyVersion": r"^1\.28.*"})]),
        envoy_filter("v127", "default", [only({"proxyVersion": r"^1\.27.*"})]),
        envoy_filter("meta", "default", [only({"metadata": {"ROLE": "edge"}})]),
        envoy_filter("bad-regex", "default", [only({"proxyVersion": "("})]),
    )
    assert names(found, proxy()) == ["default/v128"]
    assert names(found, proxy(ROLE="edge")) == ["default/meta", "default/v128"]
    assert names(found, proxy(ISTIO_VERSION="")) == []


def test_no_filters_costs_no_selection() -> None:
    empty = index()
    assert not empty
    assert empty.patches_for(proxy()) == ()
    only_other = index(envoy_filter("elsewhere", "other", [PATCH]))
    assert only_other.patches_for(proxy()) == ()
    assert only_other._selections == {}
