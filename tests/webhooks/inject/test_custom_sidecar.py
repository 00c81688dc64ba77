"""Operators' own templates end to end: an ``--inject-config`` directory whose ``sidecar`` template
replaces the built-in one, and Istio's chart templates (read from a local Istio git mirror when there
is one; never copied into this repository)."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml
from support.reference import istio_file

from meshpilot.webhooks.inject.config import InjectConfig, InjectionError, load_config_dir, parse_config
from meshpilot.webhooks.inject.context import TemplateContext, Workload
from meshpilot.webhooks.inject.inject import inject_pod
from meshpilot.webhooks.inject.quantity import canonical_quantity
from meshpilot.webhooks.inject.review import InjectionHandler, handle_inject
from meshpilot.webhooks.inject.source import InjectConfigSource
from meshpilot.webhooks.inject.template import render_text

CUSTOM_SIDECAR = """\
{{- $mode := annotation .ObjectMeta `sidecar.istio.io/interceptionMode` .ProxyConfig.InterceptionMode }}
{{- define "resources" }}
  {{- if isset .ObjectMeta.Annotations `sidecar.example.com/cpu` }}
      requests:
        cpu: {{ index .ObjectMeta.Annotations `sidecar.example.com/cpu` | quote }}
  {{- else }}
      {{ toYaml .Values.custom.resources | indent 6 }}
  {{- end }}
{{- end }}
metadata:
  labels:
    custom.example.com/injected: "true"
    custom.example.com/name: {{ index .ObjectMeta.Labels `app` | default .DeploymentMeta.Name | quote }}
  annotations:
    custom.example.com/mode: {{ $mode | quote }}
spec:
  initContainers:
  {{- if ne $mode "NONE" }}
  - name: custom-init
    image: {{ .Values.custom.hub }}/init:{{ .Values.custom.tag }}
    args: ["-p", {{ valueOrDefault .Values.custom.port "15001" | quote }}]
  {{- end }}
  containers:
  - name: custom-proxy
    image: {{ .Values.custom.hub }}/proxy:{{ .Values.custom.tag }}
    env:
    {{- range $i, $c := .Spec.Containers }}
    - name: APP_{{ $i }}
      value: {{ $c.Name | quote }}
    {{- end }}
    {{- with .Values.custom.extraEnv }}
    {{- range $k, $v := . }}
    - name: {{ $k }}
      value: {{ $v | quote }}
    {{- end }}
    {{- end }}
    - name: SERVICE_ACCOUNT
      value: {{ valueOrDefault .Spec.ServiceAccountName "default" | quote }}
    resources:
    {{- template "resources" . }}
"""

CUSTOM_VALUES = """\
custom:
  hub: registry.example.com
  tag: "2.0"
  extraEnv:
    ZED: last
    ALPHA: first
  resources:
    limits:
      memory: 256Mi
"""

POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "shop-1", "namespace": "default", "labels": {"app": "shop"}},
    "spec": {"containers": [{"name": "shop", "image": "shop:1"}, {"name": "cache", "image": "cache:1"}]},
}


def _inject_through_handler(config: InjectConfig, pod: dict[str, Any]) -> dict[str, Any]:
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u", "namespace": "default", "object": pod},
    }
    response = handle_inject(review, config)["response"]
    assert response["allowed"], response.get("status")
    patch = json.loads(base64.b64decode(response["patch"]))
    result: dict[str, Any] = jsonpatch.apply_patch(pod, patch)
    return result


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    (tmp_path / "config").write_text(yaml.safe_dump({"templates": {"sidecar": CUSTOM_SIDECAR}}))
    (tmp_path / "values").write_text(CUSTOM_VALUES)
    return tmp_path


def test_config_sidecar_template_replaces_the_builtin(config_dir: Path) -> None:
    pod = _inject_through_handler(load_config_dir(config_dir), copy.deepcopy(POD))
    spec, metadata = pod["spec"], pod["metadata"]
    # The template's containers come first, as istiod's strategic merge puts them.
    assert [c["name"] for c in spec["containers"]] == ["custom-proxy", "shop", "cache"]
    assert [c["name"] for c in spec["initContainers"]] == ["custom-init"]
    assert spec["initContainers"][0] == {
        "name": "custom-init",
        "image": "registry.example.com/init:2.0",
        "args": ["-p", "15001"],
    }
    proxy = spec["containers"][0]
    assert proxy["image"] == "registry.example.com/proxy:2.0"
    assert proxy["env"] == [
        {"name": "APP_0", "value": "shop"},
        {"name": "APP_1", "value": "cache"},
        {"name": "ALPHA", "value": "first"},
        {"name": "ZED", "value": "last"},
        {"name": "SERVICE_ACCOUNT", "value": "default"},
    ]
    assert proxy["resources"] == {"limits": {"memory": "256Mi"}}
    assert metadata["labels"]["custom.example.com/name"] == "shop"
    assert metadata["annotations"]["custom.example.com/mode"] == "REDIRECT"
    status = json.loads(metadata["annotations"]["sidecar.istio.io/status"])
    assert status["containers"] == ["custom-proxy"]
    assert status["initContainers"] == ["custom-init"]
    # Nothing of the built-in template is added.
    assert "istio-proxy" not in [c["name"] for c in spec["containers"]]


def test_config_sidecar_template_reads_annotations(config_dir: Path) -> None:
    pod = copy.deepcopy(POD)
    pod["metadata"]["annotations"] = {
        "sidecar.istio.io/interceptionMode": "NONE",
        "sidecar.example.com/cpu": "250m",
    }
    pod["spec"]["serviceAccountName"] = "shop-sa"
    injected = _inject_through_handler(load_config_dir(config_dir), pod)
    spec = injected["spec"]
    assert "initContainers" not in spec
    proxy = spec["containers"][0]
    assert proxy["resources"] == {"requests": {"cpu": "250m"}}
    assert {"name": "SERVICE_ACCOUNT", "value": "shop-sa"} in proxy["env"]
    assert injected["metadata"]["annotations"]["custom.example.com/mode"] == "NONE"


def test_without_a_sidecar_template_the_builtin_is_used(tmp_path: Path) -> None:
    (tmp_path / "config").write_text("policy: enabled\n")
    pod = _inject_through_handler(load_config_dir(tmp_path), copy.deepcopy(POD))
    assert "istio-proxy" in [c["name"] for c in pod["spec"]["containers"]]


def test_a_template_that_does_not_parse_keeps_the_last_good_config(config_dir: Path) -> None:
    handler = InjectionHandler(InjectConfigSource.load(config_dir))
    source = InjectConfigSource(handler, config_dir)
    good = handler.config
    (config_dir / "config").write_text(yaml.safe_dump({"templates": {"sidecar": "{{ if .Values }}"}}))
    assert source.reload() is False
    assert handler.config is good
    with pytest.raises(InjectionError, match="template: sidecar:1: unexpected EOF"):
        InjectConfigSource.load(config_dir)


# -- Istio's own chart templates, read from the pinned istio.io/istio module (`make reference`)

CHART = "manifests/charts/istio-control/istio-discovery"


def _chart_values() -> dict[str, Any]:
    """The injector's values as the chart renders them: its defaults, with ``pilot.cni`` beside."""
    values: dict[str, Any] = yaml.safe_load(istio_file(f"{CHART}/values.yaml"))[
        "_internal_defaults_do_not_set"
    ]
    values["pilot"] = {"cni": values.get("cni", {})}
    values["global"].update({"hub": "docker.io/istio", "tag": "1.28.0"})
    return values


@pytest.mark.reference
@pytest.mark.parametrize(
    "name", ["injection-template", "gateway-injection-template", "grpc-agent", "grpc-simple"]
)
def test_istio_chart_templates_parse_and_render(name: str) -> None:
    text = istio_file(f"{CHART}/files/{name}.yaml")
    config = parse_config("{}", yaml.safe_dump(_chart_values()))
    ctx = TemplateContext(
        copy.deepcopy(POD), Workload("shop", "default", "apps/v1", "Deployment"), {}, config.values, "default"
    )
    rendered = yaml.safe_load(render_text(name, text, ctx))
    assert isinstance(rendered, dict)
    assert rendered["spec"]["containers"]


def _normalise(pod: dict[str, Any]) -> dict[str, Any]:
    """What Go's typed Pod does on the way out: zero ``initialDelaySeconds`` (omitempty) vanishes and
    resource quantities are canonical."""
    pod = copy.deepcopy(pod)
    for key in ("containers", "initContainers"):
        for container in pod["spec"].get(key, []):
            for probe in ("readinessProbe", "startupProbe", "livenessProbe"):
                if container.get(probe, {}).get("initialDelaySeconds") == 0:
                    del container[probe]["initialDelaySeconds"]
            for group in container.get("resources", {}).values():
                for resource, quantity in group.items():
                    group[resource] = canonical_quantity(str(quantity), resource)
    return pod


CASES = Path(__file__).parent / "cases"
PODS = sorted(
    p
    for p in CASES.glob("*.yaml")
    if not p.name.endswith(".golden.yaml") and "config" not in yaml.safe_load(p.read_text())
)


def _inject_or_error(pod: dict[str, Any], config: InjectConfig) -> dict[str, Any] | str | None:
    namespace = pod["metadata"].get("namespace", "default")
    try:
        injected = inject_pod(copy.deepcopy(pod), namespace, config)
    except InjectionError as err:
        return str(err)
    return _normalise(injected) if injected is not None else None


@pytest.mark.reference
@pytest.mark.parametrize("path", PODS, ids=[p.stem for p in PODS])
def test_istio_sidecar_template_matches_the_builtin(path: Path) -> None:
    """Istio's chart template, run by the engine, injects what the built-in Python template does for
    every golden pod (modulo Go's typed-Pod normalisation, see ``_normalise``)."""
    text = istio_file(f"{CHART}/files/injection-template.yaml")
    values = yaml.safe_dump(_chart_values())
    pod = yaml.safe_load(path.read_text())["pod"]
    from_chart = _inject_or_error(pod, parse_config(yaml.safe_dump({"templates": {"sidecar": text}}), values))
    builtin = _inject_or_error(pod, parse_config("{}", values))
    assert from_chart == builtin
