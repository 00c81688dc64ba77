"""A pod's own ``istio-proxy`` (or ``istio-init``) container customises the injected one (istiod's
``reapplyOverwrittenContainers``): after the templates are merged, the user's container is merged
back over the result, and kept in ``proxy.istio.io/overrides`` for later re-injection."""

from __future__ import annotations

import copy
import json
from typing import Any

from meshpilot.input_limits import InputRejected, load_json
from meshpilot.webhooks.inject.config import InjectionError
from meshpilot.webhooks.inject.merge import merge
from meshpilot.webhooks.inject.quantity import canonical_quantity

OVERRIDES_ANNOTATION = "proxy.istio.io/overrides"
# ``image: auto`` lets a user define the container (image is required) without pinning the image.
AUTO_IMAGE = "auto"
# corev1.Container's field order, which Go keeps when it writes the annotation.
CONTAINER_FIELDS = (
    "name", "image", "command", "args", "workingDir", "ports", "envFrom", "env", "resources",
    "resizePolicy", "restartPolicy", "volumeMounts", "volumeDevices", "livenessProbe", "readinessProbe",
    "startupProbe", "lifecycle", "terminationMessagePath", "terminationMessagePolicy", "imagePullPolicy",
    "securityContext", "stdin", "stdinOnce", "tty",
)  # fmt: skip


def _go_container(container: dict[str, Any]) -> dict[str, Any]:
    out = {
        k: container[k]
        for k in CONTAINER_FIELDS
        if k in container and container[k] not in (None, "", [], False)
    }
    out.setdefault("resources", {})  # a struct, never omitted
    order = {k: n for n, k in enumerate(CONTAINER_FIELDS)}
    return dict(sorted(out.items(), key=lambda kv: order[kv[0]]))


def _canonical_resources(container: dict[str, Any]) -> None:
    # Go reads the user's container into typed quantities, so "3000m" comes back as "3".
    resources = container.get("resources")
    if not isinstance(resources, dict):
        return
    for group in ("requests", "limits"):
        values = resources.get(group)
        if isinstance(values, dict):
            for name, value in values.items():
                values[name] = canonical_quantity(
                    str(value), f"container {container.get('name')} {group}.{name}"
                )


def _find(name: str, containers: list[Any]) -> dict[str, Any] | None:
    return next((c for c in containers if isinstance(c, dict) and c.get("name") == name), None)


def reapply_user_containers(
    final: dict[str, Any], original: dict[str, Any], template_spec: dict[str, Any]
) -> dict[str, Any]:
    annotations = (original.get("metadata") or {}).get("annotations") or {}
    existing: dict[str, Any] = {}
    if OVERRIDES_ANNOTATION in annotations:
        try:
            existing = load_json(str(annotations[OVERRIDES_ANNOTATION]), f"annotation {OVERRIDES_ANNOTATION}")
        except InputRejected as err:
            raise InjectionError(str(err)) from None
        if not isinstance(existing, dict):
            raise InjectionError(f"annotation {OVERRIDES_ANNOTATION}: expected a JSON object")
    spec = original.get("spec") or {}
    found: dict[str, list[dict[str, Any]]] = {"containers": [], "initContainers": []}
    for field in ("containers", "initContainers"):
        for injected in template_spec.get(field) or []:
            name = injected.get("name")
            match = _find(name, existing.get(field) or [])
            if match is None:
                pod_lists = spec.get("containers") or []
                if field == "initContainers":
                    pod_lists = [*(spec.get("initContainers") or []), *pod_lists]
                match = _find(name, pod_lists)
            if match is None:
                continue
            overlay = copy.deepcopy(match)
            if overlay.get("image") == AUTO_IMAGE:
                del overlay["image"]
            _canonical_resources(overlay)
            found[field].append(overlay)
            final = merge(final, {"spec": {field: [overlay]}})
    if found["containers"] or found["initContainers"]:
        record = {k: [_go_container(c) for c in v] for k, v in found.items() if v}
        final.setdefault("metadata", {}).setdefault("annotations", {})[OVERRIDES_ANNOTATION] = json.dumps(
            record, separators=(",", ":")
        )
    return final


def adjust_init_user(final: dict[str, Any], original: dict[str, Any], tproxy: bool) -> None:
    """istiod's ``adjustInitContainerUser``: iptables must exempt the uid the user's proxy runs as; under
    TPROXY the proxy must stay root."""
    user = _find("istio-proxy", (original.get("spec") or {}).get("containers") or [])
    context = (user or {}).get("securityContext") or {}
    run_as = context.get("runAsUser")
    if run_as is None and context.get("runAsGroup") is None:
        return
    spec = final.get("spec") or {}
    init = _find("istio-init", spec.get("initContainers") or [])
    if init is None:
        return
    if tproxy and run_as is not None:
        sidecar = _find("istio-proxy", spec.get("containers") or [])
        if sidecar is not None:
            sidecar.setdefault("securityContext", {})["runAsUser"] = 0
    if not run_as:
        return
    args = init.get("args") or []
    for n, arg in enumerate(args[:-1]):
        if arg == "-u":
            args[n + 1] = str(run_as)
            return
