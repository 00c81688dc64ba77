"""Application probes sent through the agent (istiod's app_probe.go): the kubelet cannot reach the app
once mTLS is strict, so HTTP, TCP and gRPC probes (and HTTP/TCP lifecycle hooks) become HTTP GETs of
the agent's status port at ``/app-health/<container>/<livez|readyz|startupz>`` (hooks:
``/app-lifecycle/<container>/<prestopz|poststartz>``), and the originals travel to the agent as JSON
in ISTIO_KUBE_APP_PROBERS."""

from __future__ import annotations

import json
from typing import Any

from meshpilot.input_limits import is_decimal

PROBE_PATHS = {"readinessProbe": "readyz", "livenessProbe": "livez", "startupProbe": "startupz"}
HOOK_PATHS = {"preStop": "prestopz", "postStart": "poststartz"}
PROBERS_ENV = "ISTIO_KUBE_APP_PROBERS"
REWRITE_ANNOTATION = "sidecar.istio.io/rewriteAppHTTPProbers"
# Go's field order for the actions, so the JSON reads as istiod's.
ACTION_FIELDS = {
    "httpGet": ("path", "port", "host", "scheme", "httpHeaders"),
    "tcpSocket": ("port", "host"),
    "grpc": ("port", "service"),
}


def _prober(handler: dict[str, Any], ports: dict[str, int], status_port: int) -> dict[str, Any] | None:
    """The prober the agent runs (app_probe.go's Prober), or None when istiod leaves it out: exec
    handlers, named ports the container does not declare, and probes already pointing at the agent."""
    kind = next((k for k in ACTION_FIELDS if isinstance(handler.get(k), dict)), None)
    if kind is None:
        return None
    action = handler[kind]
    out = {f: action[f] for f in ACTION_FIELDS[kind] if action.get(f) not in (None, "", [])}
    port = out.get("port")
    if kind != "grpc":
        if isinstance(port, str) and not is_decimal(port):
            if port not in ports:
                return None
            out["port"] = ports[port]
        elif isinstance(port, str):
            out["port"] = int(port)
        elif port == status_port:
            return None
    prober: dict[str, Any] = {kind: out}
    if handler.get("timeoutSeconds"):
        prober["timeoutSeconds"] = handler["timeoutSeconds"]
    return prober


def _rewritten(handler: dict[str, Any], path: str, status_port: int) -> dict[str, Any] | None:
    kind = next((k for k in ACTION_FIELDS if isinstance(handler.get(k), dict)), None)
    if kind is None:
        return None
    out = {k: v for k, v in handler.items() if k not in ACTION_FIELDS}
    action = dict(handler["httpGet"]) if kind == "httpGet" else {}
    action["path"] = path
    action["port"] = status_port
    # The agent calls the app over HTTPS itself; the kubelet talks plain HTTP to the agent.
    if action.get("scheme") == "HTTPS":
        action["scheme"] = "HTTP"
    out["httpGet"] = action
    return out


def rewrite_probes(pod: dict[str, Any], status_port: int, proxy_name: str) -> None:
    """Rewrites the pod's app containers in place and adds ISTIO_KUBE_APP_PROBERS to the proxy."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if annotations.get(REWRITE_ANNOTATION, "true").lower() == "false":
        return
    spec = pod.get("spec") or {}
    probers: dict[str, Any] = {}
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        name = container.get("name")
        if name == proxy_name:
            continue
        ports = {p["name"]: p.get("containerPort") for p in container.get("ports") or [] if p.get("name")}
        handlers = [
            (container, field, f"/app-health/{name}/{suffix}") for field, suffix in PROBE_PATHS.items()
        ]
        lifecycle = container.get("lifecycle")
        if isinstance(lifecycle, dict):
            handlers += [(lifecycle, f, f"/app-lifecycle/{name}/{s}") for f, s in HOOK_PATHS.items()]
        for owner, field, path in handlers:
            handler = owner.get(field)
            if not isinstance(handler, dict):
                continue
            prober = _prober(handler, ports, status_port)
            if prober is not None:
                probers[path] = prober
            rewritten = _rewritten(handler, path, status_port)
            if rewritten is not None:
                owner[field] = rewritten
    if not probers:
        return
    # Go marshals the map with sorted keys and each struct in field order.
    value = json.dumps(dict(sorted(probers.items())), separators=(",", ":"))
    for container in spec.get("containers") or []:
        if container.get("name") == proxy_name:
            container.setdefault("env", []).append({"name": PROBERS_ENV, "value": value})
