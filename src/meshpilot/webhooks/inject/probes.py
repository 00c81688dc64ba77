"""Application probes sent through the agent (istiod's app_probe.go): the kubelet cannot reach the app
once mTLS is strict, so HTTP, TCP and gRPC probes become HTTP GETs of the agent's status port at
``/app-health/<container>/<livez|readyz|startupz>``, and the originals travel to the agent as JSON in
ISTIO_KUBE_APP_PROBERS."""

from __future__ import annotations

from typing import Any

from meshpilot.webhooks.inject.context import go_json

PROBE_PATHS = {"livenessProbe": "livez", "readinessProbe": "readyz", "startupProbe": "startupz"}
PROBERS_ENV = "ISTIO_KUBE_APP_PROBERS"
REWRITE_ANNOTATION = "sidecar.istio.io/rewriteAppHTTPProbers"


def _resolve_port(port: Any, container: dict[str, Any]) -> Any:
    """A named port becomes the number the container declares for it, as the agent needs a number."""
    if isinstance(port, str) and not port.isdigit():
        for declared in container.get("ports") or []:
            if declared.get("name") == port:
                return declared.get("containerPort")
    elif isinstance(port, str):
        return int(port)
    return port


def _original(probe: dict[str, Any], container: dict[str, Any]) -> dict[str, Any] | None:
    """The prober the agent runs, in app_probe.go's Prober JSON shape, or None for exec probes."""
    out: dict[str, Any] = {}
    for kind in ("httpGet", "tcpSocket", "grpc"):
        if kind in probe:
            action = dict(probe[kind])
            action["port"] = _resolve_port(action.get("port"), container)
            out[kind] = action
            break
    else:
        return None
    if probe.get("timeoutSeconds"):
        out["timeoutSeconds"] = probe["timeoutSeconds"]
    return out


def rewrite_probes(pod: dict[str, Any], status_port: int, proxy_name: str) -> None:
    """Rewrites the pod's app containers in place and adds ISTIO_KUBE_APP_PROBERS to the proxy."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if annotations.get(REWRITE_ANNOTATION, "true").lower() == "false":
        return
    spec = pod.get("spec") or {}
    probers: dict[str, Any] = {}
    for container in spec.get("containers") or []:
        if container.get("name") == proxy_name:
            continue
        for field, suffix in PROBE_PATHS.items():
            probe = container.get(field)
            if not isinstance(probe, dict):
                continue
            original = _original(probe, container)
            if original is None:
                continue
            path = f"/app-health/{container.get('name')}/{suffix}"
            probers[path] = original
            rewritten = {k: v for k, v in probe.items() if k not in ("httpGet", "tcpSocket", "grpc")}
            rewritten["httpGet"] = {"path": path, "port": status_port}
            container[field] = rewritten
    if not probers:
        return
    for container in spec.get("containers") or []:
        if container.get("name") == proxy_name:
            container.setdefault("env", []).append({"name": PROBERS_ENV, "value": go_json(probers)})
