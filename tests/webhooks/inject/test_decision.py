"""istiod's injectRequired, case by case."""

from __future__ import annotations

from typing import Any

import pytest

from meshpilot.webhooks.inject.config import InjectConfig, InjectionError, parse_config
from meshpilot.webhooks.inject.decision import injection_required, selector_matches


def _pod(labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"labels": labels or {}, "annotations": annotations or {}}, "spec": {}}


KEY = "sidecar.istio.io/inject"


@pytest.mark.parametrize(
    ("label", "annotation", "policy", "expected"),
    [
        (None, None, "enabled", True),
        (None, None, "disabled", False),
        ("true", "false", "disabled", True),
        ("false", "true", "enabled", False),
        (None, "true", "disabled", True),
        (None, "false", "enabled", False),
        ("yes", None, "enabled", True),  # not true/false: the policy decides
        ("yes", None, "disabled", False),
        (None, None, "bogus", False),  # istiod turns injection off on an unknown policy
    ],
)
def test_label_annotation_and_policy(
    label: str | None, annotation: str | None, policy: str, expected: bool
) -> None:
    pod = _pod({KEY: label} if label else None, {KEY: annotation} if annotation else None)
    assert injection_required(pod, "default", InjectConfig(policy=policy)) is expected


def test_never_selector_is_checked_before_always_and_explicit_choice_beats_both() -> None:
    both = {"matchLabels": {"app": "a"}}
    config = InjectConfig(policy="enabled", never_inject_selector=(both,), always_inject_selector=(both,))
    assert injection_required(_pod({"app": "a"}), "default", config) is False
    assert injection_required(_pod({"app": "a", KEY: "true"}), "default", config) is True


def test_ignored_namespaces_follow_the_istio_namespace() -> None:
    config = parse_config("", "global:\n  istioNamespace: mesh\n")
    assert injection_required(_pod(), "mesh", config) is False
    assert injection_required(_pod(), "istio-system", config) is True
    for ns in ("kube-system", "kube-public", "kube-node-lease", "local-path-storage"):
        assert injection_required(_pod(), ns, config) is False


def test_selector_operators() -> None:
    labels = {"app": "a", "tier": "web"}
    assert selector_matches(
        {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["web"]}]}, labels
    )
    assert not selector_matches(
        {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["web"]}]}, labels
    )
    assert selector_matches({"matchExpressions": [{"key": "app", "operator": "Exists"}]}, labels)
    assert selector_matches({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}, labels)
    assert not selector_matches({}, labels)  # empty selectors are skipped, as in istiod
    with pytest.raises(InjectionError, match="operator"):
        selector_matches({"matchExpressions": [{"key": "app", "operator": "Near"}]}, labels)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("[1, 2]", "expected a mapping"),
        ("templates: [a]", "templates must map"),
        ("neverInjectSelector: {app: a}", "neverInjectSelector"),
        ("policy: [unclosed", "not valid YAML"),
        ("aliases: {a: 3}", "aliases"),
        ("alwaysInjectSelector: [{matchLabels: 3}]", "matchLabels"),
        (
            "neverInjectSelector: [{matchExpressions: [{key: a, operator: In, values: 1}]}]",
            "matchExpressions",
        ),
    ],
)
def test_bad_config_is_a_clear_error(config: str, message: str) -> None:
    with pytest.raises(InjectionError, match=message):
        parse_config(config)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ("global: null", "values: global must be a mapping"),
        ("global:\n  proxy: 3", "global.proxy must be a mapping"),
        ("global:\n  proxy:\n    resources: [1]", "global.proxy.resources"),
        ("global:\n  proxy:\n    statusPort: abc", "global.proxy.statusPort"),
    ],
)
def test_bad_values_are_a_clear_error(values: str, message: str) -> None:
    with pytest.raises(InjectionError, match=message):
        parse_config("", values)
