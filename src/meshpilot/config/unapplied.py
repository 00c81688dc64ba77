"""Config meshpilot stores, validates and serves to tools but does not yet turn into Envoy config.

Such an object must not pass unnoticed: each is logged by name when it arrives or changes, and the
objects present are counted by kind (``meshpilot_unapplied_config``), so a dashboard shows that a
policy an operator wrote has no effect yet.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Gauge

from meshpilot.config.store import ConfigEvent, EventType
from meshpilot.model.config import ConfigKey
from meshpilot.model.kind import Kind

log = logging.getLogger(__name__)

#: The kinds not applied yet, and what that means for the mesh.
UNAPPLIED: dict[Kind, str] = {
    Kind.ENVOY_FILTER: "its patches are not applied to the generated config",
}


class UnappliedConfig:
    def __init__(self, registry: CollectorRegistry, kinds: dict[Kind, str] | None = None) -> None:
        self._kinds = UNAPPLIED if kinds is None else kinds
        self._present: dict[Kind, set[ConfigKey]] = {kind: set() for kind in self._kinds}
        self._gauge = Gauge(
            "meshpilot_unapplied_config",
            "Config objects stored but not applied to the generated Envoy config (meshpilot only).",
            ["kind"],
            registry=registry,
        )
        for kind in self._kinds:
            self._gauge.labels(kind.value).set(0)

    def on_event(self, event: ConfigEvent) -> None:
        config = event.config
        consequence = self._kinds.get(config.kind)
        if consequence is None:
            return
        present = self._present[config.kind]
        if event.type is EventType.DELETE:
            present.discard(config.key)
        else:
            present.add(config.key)
            log.warning(
                "%s %s/%s is stored but not applied: %s",
                config.kind.value,
                config.namespace,
                config.name,
                consequence,
            )
        self._gauge.labels(config.kind.value).set(len(present))
