"""istiod's metrics merging (webhook.go ``applyPrometheusMerge``): Prometheus scrapes the agent on its
status port, which serves Envoy's and the app's metrics together; the app's own scrape settings go
to the agent in ISTIO_PROMETHEUS_ANNOTATIONS."""

from __future__ import annotations

import json
from typing import Any

from meshpilot.input_limits import is_decimal
from meshpilot.webhooks.inject.config import InjectionError

PORT, PATH, SCRAPE = "prometheus.io/port", "prometheus.io/path", "prometheus.io/scrape"
MERGE_ANNOTATION = "prometheus.istio.io/merge-metrics"
ENV = "ISTIO_PROMETHEUS_ANNOTATIONS"


def _sanitized(key: str) -> str:
    # istiod matches the annotation names after turning every other character into "_", so the
    # ``prometheus_io_port`` spelling counts too.
    return "".join(c if c.isalnum() or c == "_" else "_" for c in key)


def _find(annotations: dict[str, str], key: str) -> str | None:
    wanted = _sanitized(key)
    for name, value in annotations.items():
        if _sanitized(name) == wanted:
            return value
    return None


def apply_prometheus_merge(pod: dict[str, Any], status_port: int, proxy_name: str) -> None:
    metadata = pod.setdefault("metadata", {})
    annotations: dict[str, str] = metadata.setdefault("annotations", {})
    if (_find(annotations, SCRAPE) or "").lower() == "false":
        return
    if annotations.get(MERGE_ANNOTATION, "true").lower() == "false":
        return
    target = str(status_port)
    port = _find(annotations, PORT)
    if port == target:
        return  # already merged, or the user points at the agent on purpose
    if port:
        if not is_decimal(port) or not 0 < int(port) <= 65535:
            raise InjectionError(f"invalid prometheus scrape configuration: invalid port {port!r}")
        if str(int(port)) == target:
            raise InjectionError(
                f"invalid prometheus scrape configuration: port {port} conflicts with agent port"
            )
    scrape = {
        "scrape": _find(annotations, SCRAPE) or "",
        "path": _find(annotations, PATH) or "",
        "port": port or "",
    }
    if any(scrape.values()):
        for container in (pod.get("spec") or {}).get("containers") or []:
            if container.get("name") == proxy_name:
                # Go writes the struct's fields in declaration order, not sorted.
                container.setdefault("env", []).append(
                    {"name": ENV, "value": json.dumps(scrape, separators=(",", ":"))}
                )
    wanted = {_sanitized(k) for k in (PORT, PATH, SCRAPE)}
    for name in [n for n in annotations if _sanitized(n) in wanted]:
        del annotations[name]
    annotations[PORT] = target
    annotations[PATH] = "/stats/prometheus"
    annotations[SCRAPE] = "true"
