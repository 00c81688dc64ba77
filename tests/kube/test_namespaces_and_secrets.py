"""Discovery selectors and multicluster Secret decoding: the pure logic under the watches."""

from __future__ import annotations

import base64

import pytest

from meshpilot.config.errors import ConfigError
from meshpilot.kube.informer import Change
from meshpilot.kube.multicluster import RemoteClusters, decode_secret
from meshpilot.kube.namespaces import NamespaceFilter, selectors_of
from meshpilot.model.label_selector import SelectorError, label_selector_matches
from meshpilot.model.mesh import apply_mesh_config
from meshpilot.registry.kube.controller import KubeRegistry


def test_label_selectors() -> None:
    labels = {"env": "prod", "team": "a"}
    assert label_selector_matches({}, labels), "an empty selector selects everything"
    assert label_selector_matches({"matchLabels": {"env": "prod"}}, labels)
    assert not label_selector_matches({"matchLabels": {"env": "dev"}}, labels)
    expr = {"key": "team", "operator": "In", "values": ["a", "b"]}
    assert label_selector_matches({"matchExpressions": [expr]}, labels)
    assert not label_selector_matches({"matchExpressions": [{**expr, "operator": "NotIn"}]}, labels)
    assert label_selector_matches({"matchExpressions": [{"key": "x", "operator": "DoesNotExist"}]}, labels)
    assert not label_selector_matches({"matchExpressions": [{"key": "x", "operator": "Exists"}]}, labels)
    with pytest.raises(SelectorError, match="operator 'Near'"):
        label_selector_matches({"matchExpressions": [{"key": "x", "operator": "Near"}]}, labels)


def test_namespace_filter_membership_changes() -> None:
    f = NamespaceFilter()
    f.set_namespace("a", {"mesh": "on"})
    f.set_namespace("b", {})
    assert f.allows("a") and f.allows("b") and f.allows("unknown"), "no selectors: everything"
    changed = f.set_selectors([{"matchLabels": {"mesh": "on"}}])
    assert changed == {"b"}
    assert f.allows("a") and not f.allows("b") and not f.allows("unknown")
    assert f.allows(""), "cluster-scoped objects always pass"
    assert f.set_namespace("b", {"mesh": "on"}) is True
    assert f.set_namespace("b", {"mesh": "on", "x": "y"}) is False
    assert f.set_namespace("b", None) is True
    assert f.set_selectors([{"matchLabels": {"mesh": "on"}}]) == set(), "same selectors: nothing changes"


def test_selectors_from_mesh_config() -> None:
    mesh = apply_mesh_config(
        "discoverySelectors:\n"
        "- matchLabels: {env: prod}\n"
        "- matchExpressions: [{key: team, operator: Exists}]\n"
    )
    assert selectors_of(mesh) == [
        {"matchLabels": {"env": "prod"}},
        {"matchExpressions": [{"key": "team", "operator": "Exists"}]},
    ]


def test_secret_decoding() -> None:
    raw = {"data": {"west": base64.b64encode(b"apiVersion: v1\n").decode()}}
    assert decode_secret(raw).kubeconfigs == {"west": "apiVersion: v1\n"}
    with pytest.raises(ConfigError, match=r"data\.east is not a base64 kubeconfig"):
        decode_secret({"data": {"east": "***"}})


def _kubeconfig(server: str) -> str:
    return (
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: '{server}'}}}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {}}]\n"
    )


class _Updater:
    def config_update(self, request: object) -> None: ...

    def eds_update(self, *args: object) -> None: ...

    def service_update(self, *args: object) -> None: ...

    def proxy_update(self, *args: object) -> None: ...


async def test_remote_clusters_from_secrets() -> None:
    """The local cluster's key is ignored, a duplicate ID loses to the first Secret, a bad kubeconfig
    is reported and skipped."""
    attached: list[str] = []
    remotes = RemoteClusters(
        "Kubernetes",
        lambda cid: KubeRegistry(_Updater(), cluster_id=cid),
        lambda r: attached.append(r.cluster_id),
        lambda r: attached.remove(r.cluster_id),
        watch_timeout=(30, 30),
    )
    one = decode_secret(
        {
            "data": {
                "Kubernetes": base64.b64encode(_kubeconfig("http://127.0.0.1:9").encode()).decode(),
                "west": base64.b64encode(_kubeconfig("http://127.0.0.1:9").encode()).decode(),
                "broken": base64.b64encode(b"- not a mapping\n").decode(),
            }
        }
    )
    two = decode_secret(
        {"data": {"west": base64.b64encode(_kubeconfig("http://127.0.0.2:9").encode()).decode()}}
    )
    try:
        remotes.apply([Change(("istio-system", "a"), one), Change(("istio-system", "b"), two)])
        assert attached == ["west"]
        assert remotes.clusters["west"].secret == ("istio-system", "a")
        remotes.apply([Change(("istio-system", "a"), None, deleted=True)])
        assert attached == ["west"] and remotes.clusters["west"].secret == ("istio-system", "b")
        remotes.apply([Change(("istio-system", "b"), None, deleted=True)])
        assert attached == []
    finally:
        remotes.stop()
