"""Config meshpilot stores, validates and serves to tools but does not (fully) turn into Envoy config.

Such an object must not pass unnoticed: each is logged by name, with what is not applied, when it
arrives or changes, and the objects present are counted by kind (``meshpilot_unapplied_config``),
so a dashboard shows that something an operator wrote has no effect. Which objects of a kind are
concerned is for the code that applies the kind to say (an EnvoyFilter only when one of its patches
is of a kind meshpilot leaves out, or cannot be read), so it is passed in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Gauge

from meshpilot.config.store import ConfigEvent, EventType
from meshpilot.model.config import Config, ConfigKey
from meshpilot.model.kind import Kind

log = logging.getLogger(__name__)

#: What of an object is not applied, or None when all of it is.
Unapplied = Callable[[Config], "str | None"]


class UnappliedConfig:
    def __init__(self, registry: CollectorRegistry, kinds: Mapping[Kind, Unapplied]) -> None:
        self._kinds = dict(kinds)
        self._present: dict[Kind, set[ConfigKey]] = {kind: set() for kind in self._kinds}
        self._gauge = Gauge(
            "meshpilot_unapplied_config",
            "Config objects stored but not (fully) applied to the generated Envoy config (meshpilot only).",
            ["kind"],
            registry=registry,
        )
        for kind in self._kinds:
            self._gauge.labels(kind.value).set(0)

    def on_event(self, event: ConfigEvent) -> None:
        config = event.config
        check = self._kinds.get(config.kind)
        if check is None:
            return
        present = self._present[config.kind]
        consequence = None if event.type is EventType.DELETE else check(config)
        if consequence is None:
            present.discard(config.key)
        else:
            present.add(config.key)
            log.warning(
                "%s %s/%s is stored but not applied in full: %s",
                config.kind.value,
                config.namespace,
                config.name,
                consequence,
            )
        self._gauge.labels(config.kind.value).set(len(present))
