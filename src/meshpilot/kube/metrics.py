"""``pilot_k8s_reg_events`` and ``pilot_k8s_cfg_events``, labelled as istiod labels them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from meshpilot.model.kind import Kind

#: The ``type`` istiod's Kubernetes registry reports for each informer.
_REGISTRY_TYPES = {
    Kind.NAMESPACE: "Namespaces",
    Kind.SERVICE: "Services",
    Kind.ENDPOINT_SLICE: "EndpointSlice",
    Kind.POD: "Pods",
    Kind.NODE: "Nodes",
}


@dataclass(frozen=True, slots=True)
class KubeMetrics:
    registry_events: Any
    config_events: Any

    @classmethod
    def create(cls, registry: CollectorRegistry) -> KubeMetrics:
        return cls(
            Counter(
                "pilot_k8s_reg_events", "Events from k8s registry.", ["type", "event"], registry=registry
            ),
            Counter("pilot_k8s_cfg_events", "Events from k8s config.", ["type", "event"], registry=registry),
        )

    def event(self, kind: Kind, event: str) -> None:
        """``event`` is add, update or delete."""
        registry_type = _REGISTRY_TYPES.get(kind)
        if registry_type is not None:
            self.registry_events.labels(type=registry_type, event=event).inc()
        else:
            self.config_events.labels(type=kind.value, event=event).inc()
