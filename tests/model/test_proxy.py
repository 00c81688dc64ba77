"""Proxy identity from the node ID and metadata, as istiod parses it."""

from __future__ import annotations

import dataclasses

import pytest
from support.mesh_objects import CLIENT, mesh_objects
from support.model import build

from meshpilot.model.proxy import (
    InterceptionMode,
    InvalidNode,
    NodeMetadata,
    NodeType,
    ProxyState,
    parse_proxy,
)


def test_sidecar_node_id_and_metadata() -> None:
    meta = NodeMetadata.parse(
        {
            "NAMESPACE": "bookinfo",
            "CLUSTER_ID": "east",
            "ISTIO_VERSION": "1.28.0",
            "LABELS": {"app": "reviews"},
            "INTERCEPTION_MODE": "NONE",
            "INSTANCE_IPS": "10.1.1.1,fd00::1",
        }
    )
    proxy = parse_proxy(
        "sidecar~10.1.1.9~reviews-v1-abc.bookinfo~bookinfo.svc.cluster.local",
        meta,
        extensions=frozenset({"istio.stats"}),
    )
    assert proxy.type is NodeType.SIDECAR
    assert proxy.ip_addresses == ("10.1.1.1", "fd00::1"), "INSTANCE_IPS wins over the node ID's IP"
    assert proxy.id == "reviews-v1-abc.bookinfo"
    assert proxy.config_namespace == "bookinfo"
    assert proxy.cluster_id == "east"
    assert proxy.interception_mode is InterceptionMode.NONE
    assert proxy.pod_key == ("bookinfo", "reviews-v1-abc")
    assert proxy.labels == {"app": "reviews"}
    assert proxy.has_extension("istio.stats")


def test_namespace_falls_back_to_the_dns_domain_and_cluster_to_the_default() -> None:
    proxy = parse_proxy(
        "router~10.0.0.1~gw.istio-system~istio-system.svc.cluster.local",
        NodeMetadata.parse({}),
        default_cluster_id="Kubernetes",
    )
    assert proxy.type is NodeType.ROUTER
    assert proxy.config_namespace == "istio-system"
    assert proxy.cluster_id == "Kubernetes"
    assert proxy.interception_mode is InterceptionMode.REDIRECT
    assert proxy.ip_addresses == ("10.0.0.1",)


@pytest.mark.parametrize(
    ("node_id", "message"),
    [
        ("sidecar~10.0.0.1~pod.ns", "missing parts"),
        ("sidecar~10.0.0.1~pod.ns~ns.svc.cluster.local~extra", "missing parts"),
        ("", "missing parts"),
        ("frontend~10.0.0.1~pod.ns~ns.svc.cluster.local", "invalid node type"),
        ("sidecar~10.0.0~pod.ns~ns.svc.cluster.local", "no valid IP address"),
    ],
)
def test_malformed_node_ids(node_id: str, message: str) -> None:
    with pytest.raises(InvalidNode, match=message):
        parse_proxy(node_id, NodeMetadata.parse({}))


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"INTERCEPTION_MODE": "IPTABLES"}, "INTERCEPTION_MODE"),
        ({"LABELS": ["a"]}, "LABELS"),
        ({"NAMESPACE": 3}, "NAMESPACE must be a string"),
        ({"POD_PORTS": "[not json"}, "POD_PORTS"),
    ],
)
def test_malformed_metadata(raw: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidNode, match=message):
        NodeMetadata.parse(raw)


def test_pod_key_needs_name_dot_namespace_matching_the_namespace() -> None:
    meta = NodeMetadata.parse({"NAMESPACE": "a"})
    assert parse_proxy("sidecar~10.0.0.1~pod.b~a.svc.cluster.local", meta).pod_key is None
    assert parse_proxy("sidecar~10.0.0.1~pod.x.a~a.svc.cluster.local", meta).pod_key is None


def test_a_settled_state_keeps_every_field_but_the_previous_scope() -> None:
    """``settled`` and ``refresh_proxy`` build states field by field: a field added to ProxyState and
    not passed on there would be reset to its default on every push."""
    model = build(mesh_objects())
    proxy = model.proxy(CLIENT)
    model.env.refresh_proxy(proxy, model.env.build_push_context("test/2"))
    state = proxy.state
    assert state.previous_scope is not None and state.service_targets and state.labels
    settled = state.settled()
    for field in dataclasses.fields(ProxyState):
        if field.name == "previous_scope":
            assert getattr(settled, field.name) is None
        elif field.init:
            assert getattr(settled, field.name) is getattr(state, field.name), field.name
    assert settled.inbound_signature == state.inbound_signature != ()


def test_derived_answers_are_kept_per_state_and_snapshot() -> None:
    model = build(mesh_objects())
    proxy = model.proxy(CLIENT)
    first, second = model.env.build_push_context("test/2"), model.env.build_push_context("test/3")
    made: list[str] = []

    def make(what: str) -> str:
        made.append(what)
        return what

    state = proxy.state
    assert state.derived(first, "a", lambda: make("a1")) == "a1"
    assert state.derived(first, "a", lambda: make("again")) == "a1"
    assert state.derived(first, "b", lambda: make("b1")) == "b1"
    # Another snapshot (a request answered before the refresh): asked again, and only its answers kept.
    assert state.derived(second, "a", lambda: make("a2")) == "a2"
    assert state.derived(first, "a", lambda: make("a1 again")) == "a1 again"
    # A refreshed state (new labels, a new scope) keeps nothing of the one it replaces.
    model.env.refresh_proxy(proxy, first)
    assert proxy.state.derived(first, "a", lambda: make("a3")) == "a3"
    assert made == ["a1", "b1", "a2", "a1 again", "a3"]
