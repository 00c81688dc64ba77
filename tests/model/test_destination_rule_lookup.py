"""DestinationRule lookup by host: the exact host first, else the longest wildcard that covers it."""

from __future__ import annotations

from typing import Any

from support.kube import istio
from support.model import build

from meshpilot.model.push_context import PushContext


def _rule(name: str, namespace: str, host: str, **spec: Any) -> dict[str, Any]:
    return istio("DestinationRule", name, namespace, {"host": host, **spec})


def _names(push: PushContext, proxy_namespace: str, host: str, service_namespace: str) -> list[str]:
    found = push.destination_rules.lookup(proxy_namespace, host, service_namespace)
    return [config.name for entry in found for config in entry.configs]


def test_the_exact_host_then_the_longest_covering_wildcard() -> None:
    push = build(
        [
            _rule("any-com", "ns", "*.com"),
            _rule("any-example", "ns", "*.example.com"),
            _rule("api", "ns", "api.example.com"),
        ]
    ).push
    assert _names(push, "ns", "api.example.com", "ns") == ["api"]
    assert _names(push, "ns", "web.example.com", "ns") == ["any-example"]
    assert _names(push, "ns", "web.other.com", "ns") == ["any-com"]
    assert _names(push, "ns", "example.com", "ns") == ["any-com"]  # not "*.example.com": no label before
    assert _names(push, "ns", "web.example.org", "ns") == []
    # A wildcard host looks up as itself, then the wildcards that cover it.
    assert _names(push, "ns", "*.example.com", "ns") == ["any-example"]
    assert _names(push, "ns", "*.a.example.com", "ns") == ["any-example"]


def test_a_namespace_s_own_rule_before_the_exports_of_the_service_s_namespace() -> None:
    push = build(
        [
            _rule("local", "client", "reviews.shop.svc.cluster.local", exportTo=["."]),
            _rule("exported", "shop", "*.shop.svc.cluster.local"),
        ]
    ).push
    host = "reviews.shop.svc.cluster.local"
    assert _names(push, "client", host, "shop") == ["local"]
    # Another namespace has no rule of its own: the wildcard rule the service's namespace exports.
    assert _names(push, "other", host, "shop") == ["exported"]
    assert _names(push, "other", "ratings.shop.svc.cluster.local", "shop") == ["exported"]


def test_the_proxy_namespace_s_wildcard_rule_before_an_exact_rule_exported_by_the_service_s() -> None:
    push = build(
        [
            _rule("own-wildcard", "client", "*.shop.svc.cluster.local", exportTo=["."]),
            _rule("exact", "shop", "reviews.shop.svc.cluster.local"),
        ]
    ).push
    host = "reviews.shop.svc.cluster.local"
    assert _names(push, "client", host, "shop") == ["own-wildcard"]
    assert _names(push, "other", host, "shop") == ["exact"]


def test_the_root_namespace_s_exported_rule_when_no_other_applies() -> None:
    push = build(
        [
            _rule("mesh-wide", "istio-system", "*.svc.cluster.local"),
            _rule("exact", "shop", "reviews.shop.svc.cluster.local"),
        ]
    ).push
    assert _names(push, "other", "reviews.shop.svc.cluster.local", "shop") == ["exact"]
    assert _names(push, "other", "ratings.shop.svc.cluster.local", "shop") == ["mesh-wide"]
