"""One pod in, the injected pod out (istiod's ``injectPod`` and ``postProcessPod``)."""

from __future__ import annotations

import copy
import json
from typing import Any

from meshpilot.input_limits import is_decimal
from meshpilot.webhooks.inject.config import InjectConfig, InjectionError
from meshpilot.webhooks.inject.context import TemplateContext, Workload, effective_proxy_config, pod_workload
from meshpilot.webhooks.inject.decision import STATUS_ANNOTATION, injection_required
from meshpilot.webhooks.inject.merge import merge
from meshpilot.webhooks.inject.overrides import adjust_init_user, reapply_user_containers
from meshpilot.webhooks.inject.probes import rewrite_probes
from meshpilot.webhooks.inject.prometheus import apply_prometheus_merge
from meshpilot.webhooks.inject.sidecar_template import (
    INIT_NAME,
    PROXY_NAME,
    hold_application,
    interception_mode,
)
from meshpilot.webhooks.inject.template import render_templates


def _names(items: list[Any] | None) -> list[str] | None:
    # istiod appends names to a nil slice, so no names at all (unset or empty) is written as null.
    names = [str(i.get("name")) for i in items or [] if isinstance(i, dict)]
    return names or None


def _status(spec: dict[str, Any], revision: str) -> str:
    """The ``sidecar.istio.io/status`` annotation: what the templates' merged ``spec`` added, so it
    can be removed later."""
    status = {
        "initContainers": _names(spec.get("initContainers")),
        "containers": _names(spec.get("containers")),
        "volumes": _names(spec.get("volumes")),
        "imagePullSecrets": _names(spec.get("imagePullSecrets")),
        "revision": revision,
    }
    return json.dumps(status, separators=(",", ":"))


def _move(containers: list[dict[str, Any]], name: str, first: bool) -> list[dict[str, Any]]:
    picked = [c for c in containers if c.get("name") == name]
    rest = [c for c in containers if c.get("name") != name]
    return picked + rest if first else rest + picked


def _reorder(pod: dict[str, Any], hold: bool) -> None:
    spec = pod.setdefault("spec", {})
    # The proxy goes last so kubectl exec/logs default to the app, unless the app must wait for it.
    if "containers" in spec:
        spec["containers"] = _move(spec["containers"], PROXY_NAME, hold)
    if "initContainers" in spec:
        # iptables go in last so the user's init containers still reach the network.
        spec["initContainers"] = _move(spec["initContainers"], INIT_NAME, False)


def _status_port(ctx: TemplateContext) -> int:
    text = ctx.annotation("status.sidecar.istio.io/port", ctx.values["global"]["proxy"]["statusPort"])
    if not is_decimal(text) or int(text) > 65535:
        raise InjectionError(f"annotation status.sidecar.istio.io/port: {text!r} is not a port number")
    return int(text)


_CONTAINER_OBJECTS = (
    "securityContext",
    "resources",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "lifecycle",
)


def _check_shape(pod: dict[str, Any]) -> None:
    """The parts of the pod the templates read must have Kubernetes' shapes; anything else is a clear
    error here rather than a crash deep in a template."""
    metadata = pod.get("metadata", {})
    if not isinstance(metadata, dict):
        raise InjectionError("pod metadata is not a mapping")
    for key in ("labels", "annotations"):
        value = metadata.get(key) or {}
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise InjectionError(f"pod metadata.{key} must map names to strings")
    spec = pod.get("spec", {})
    if not isinstance(spec, dict):
        raise InjectionError("pod spec is not a mapping")
    for key in ("containers", "initContainers", "volumes"):
        items = spec.get(key) or []
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise InjectionError(f"pod spec.{key} must be a list of objects")
        for item in items:
            where = f"pod spec.{key}[{item.get('name')!r}]"
            if not isinstance(item.get("name"), str):
                raise InjectionError(f"{where}.name must be a string")
            if key == "volumes":
                continue
            for field in ("ports", "env", "volumeMounts"):
                value = item.get(field) or []
                if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
                    raise InjectionError(f"{where}.{field} must be a list of objects")
                if not all(isinstance(v.get("name", ""), str) for v in value):
                    raise InjectionError(f"{where}.{field}[].name must be a string")
            for field in _CONTAINER_OBJECTS:
                if item.get(field) is not None and not isinstance(item[field], dict):
                    raise InjectionError(f"{where}.{field} must be an object")


def inject_pod(
    pod: dict[str, Any],
    namespace: str,
    config: InjectConfig,
    workload: Workload | None = None,
    mesh: Any | None = None,
) -> dict[str, Any] | None:
    """The injected pod, or None when istiod's policy says this pod gets no sidecar. ``mesh`` is the
    server's MeshConfig (its ``defaultConfig`` reaches the proxy config); None means istiod's defaults."""
    if not isinstance(pod, dict):
        raise InjectionError("the object is not a pod")
    _check_shape(pod)
    pod = copy.deepcopy(pod)
    metadata = pod.setdefault("metadata", {})
    metadata.pop("managedFields", None)
    namespace = metadata.get("namespace") or namespace
    if not injection_required(pod, namespace, config):
        return None
    ctx = TemplateContext(
        pod=pod,
        workload=workload or pod_workload(pod, namespace),
        proxy_config=effective_proxy_config(pod, mesh),
        values=config.values,
        revision=config.revision,
    )
    fragments = render_templates(ctx, config)
    injected = pod
    for fragment in fragments:
        injected = merge(injected, fragment)
    template_spec: dict[str, Any] = {}
    for fragment in fragments:
        template_spec = merge(template_spec, fragment.get("spec") or {})
    injected = reapply_user_containers(injected, pod, template_spec)
    adjust_init_user(injected, pod, interception_mode(ctx) == "TPROXY")
    spec = injected.setdefault("spec", {})
    for key in ("initContainers", "containers", "volumes", "imagePullSecrets"):
        # Go omits empty lists when it writes the pod, so a template's ``initContainers: []`` adds nothing.
        if spec.get(key) == []:
            del spec[key]
    status_port = _status_port(ctx)
    # istiod points Prometheus at the mesh's status port, whatever the pod's annotation says.
    apply_prometheus_merge(injected, int(config.values["global"]["proxy"]["statusPort"]), PROXY_NAME)
    if config.values.get("sidecarInjectorWebhook", {}).get("rewriteAppHTTPProbe", True) and status_port:
        rewrite_probes(injected, status_port, PROXY_NAME)
    annotations = injected["metadata"].setdefault("annotations", {})
    annotations[STATUS_ANNOTATION] = _status(template_spec, config.revision)
    annotations.update(config.injected_annotations)
    _reorder(injected, hold_application(ctx))
    return injected
