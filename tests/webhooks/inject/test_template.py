"""The user-template subset and template selection."""

from __future__ import annotations

import pytest

from meshpilot.webhooks.inject.config import InjectConfig, InjectionError, parse_config
from meshpilot.webhooks.inject.context import TemplateContext, Workload
from meshpilot.webhooks.inject.sidecar_template import exclude_inbound_ports
from meshpilot.webhooks.inject.template import render_templates, render_text, template_names


def _ctx(annotations: dict[str, str] | None = None) -> TemplateContext:
    pod = {
        "metadata": {"name": "p", "labels": {"app": "shop"}, "annotations": annotations or {}},
        "spec": {"serviceAccountName": "sa", "containers": [{"name": "c"}]},
    }
    return TemplateContext(pod, Workload("p", "ns", "v1", "Pod"), {}, InjectConfig().values, "default")


def test_paths_index_and_trimming() -> None:
    ctx = _ctx()
    assert render_text("sa: {{ .Spec.ServiceAccountName }}", ctx) == "sa: sa"
    assert render_text('app: {{ index .ObjectMeta.Labels "app" }}', ctx) == "app: shop"
    assert render_text("a: [ {{- .Values.global.proxy.statusPort -}} ]", ctx) == "a: [15020]"
    assert render_text("missing: {{ .Values.nope.nothing }}.", ctx) == "missing: ."
    assert render_text("c: {{ .Spec.Containers }}", ctx) == 'c: [{"name":"c"}]'


@pytest.mark.parametrize("action", ["if .Values", "range .Spec.Containers", ".Values | quote", "$x"])
def test_unsupported_actions_fail_naming_the_action(action: str) -> None:
    with pytest.raises(InjectionError, match="not supported"):
        render_text("x: {{ " + action + " }}", _ctx())


def test_selection_by_annotation_default_and_alias() -> None:
    config = parse_config("defaultTemplates: [sidecar]\naliases:\n  both: [sidecar, extra]\n")
    assert template_names(_ctx(), config) == ["sidecar"]
    assert template_names(_ctx({"inject.istio.io/templates": "both"}), config) == ["sidecar", "extra"]


def test_unknown_template_name_is_an_error() -> None:
    with pytest.raises(InjectionError, match="'nope' is not in the injector config"):
        render_templates(_ctx({"inject.istio.io/templates": "nope"}), InjectConfig())


def test_user_template_must_render_to_a_mapping() -> None:
    config = parse_config("templates:\n  bad: '- a list'\n")
    with pytest.raises(InjectionError, match="must render to a pod"):
        render_templates(_ctx({"inject.istio.io/templates": "bad"}), config)


def test_exclude_inbound_ports_adds_the_status_port_once() -> None:
    assert exclude_inbound_ports("15020", "") == "15020"
    assert exclude_inbound_ports("15020", "80, 81") == "80,81,15020"
    assert exclude_inbound_ports("15020", "15020,80") == "15020,80"
    assert exclude_inbound_ports("0", "80") == "80"
