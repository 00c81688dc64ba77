"""Rendering config templates through the Go template engine, and template selection."""

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


def _render(text: str, ctx: TemplateContext | None = None) -> str:
    return render_text("t", text, ctx or _ctx())


def test_paths_index_and_trimming() -> None:
    assert _render("sa: {{ .Spec.ServiceAccountName }}") == "sa: sa"
    assert _render('app: {{ index .ObjectMeta.Labels "app" }}') == "app: shop"
    assert _render("a: [ {{- .Values.global.proxy.statusPort -}} ]") == "a: [15020]"
    # Go prints a missing map key as <no value>; a missing label (map[string]string) is "".
    assert _render("missing: {{ .Values.nope.nothing }}.") == "missing: <no value>."
    assert _render('l: "{{ index .ObjectMeta.Labels "nope" }}"') == 'l: ""'
    assert _render("c: {{ range .Spec.Containers }}{{ .Name }}{{ end }}") == "c: c"


def test_struct_fields_use_go_names() -> None:
    text = "{{ .TypeMeta.APIVersion }}/{{ .TypeMeta.Kind }} "
    text += "{{ .DeploymentMeta.Name }}.{{ .DeploymentMeta.Namespace }}"
    assert _render(text) == "v1/Pod p.ns"
    assert _render("{{ .ProxyConfig.InterceptionMode }} {{ .ProxyConfig.InterceptionMode.String }}") == (
        "REDIRECT REDIRECT"
    )
    assert _render("{{ .ProxyConfig.HoldApplicationUntilProxyStarts.GetValue }}") == "false"
    assert _render("[{{ .ProxyConfig.GetTracing.GetTlsSettings.GetCaCertificates }}]") == "[]"
    assert _render("{{ .MeshConfig.ProxyListenPort }} {{ .MeshConfig.TrustDomain }}") == "15001 cluster.local"
    assert _render("{{ .Spec.HostNetwork }} {{ .Revision }} {{ .ProxyUID }}") == "false default 1337"


def test_field_of_a_string_is_an_error_naming_template_and_line() -> None:
    with pytest.raises(InjectionError, match=r"template: t:2: can't evaluate field Nope in type string"):
        _render("a: b\n{{ .Spec.ServiceAccountName.Nope }}")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{{ if .Values }}", r"template: t:1: unexpected EOF"),
        ("x\n{{ nope .Values }}", r'template: t:2: function "nope" not defined'),
        ("{{ $x }}", r'undefined variable "\$x"'),
    ],
)
def test_parse_errors_fail_the_injection(text: str, message: str) -> None:
    with pytest.raises(InjectionError, match=message):
        _render(text)


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
