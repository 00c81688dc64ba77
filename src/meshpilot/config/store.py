"""The in-memory store of Istio config, and the events its changes raise."""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType

from meshpilot.model.config import Config, ConfigKey
from meshpilot.model.kind import Kind

log = logging.getLogger(__name__)


class EventType(enum.Enum):
    ADD = "add"
    UPDATE = "update"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class ConfigEvent:
    type: EventType
    old: Config | None
    new: Config | None

    @property
    def config(self) -> Config:
        """The object the event is about (the old one for a delete)."""
        found = self.new if self.new is not None else self.old
        assert found is not None
        return found


ConfigHandler = Callable[[ConfigEvent], None]

#: (namespace, name) -> Config for one kind.
KindView = Mapping[tuple[str, str], Config]


class ConfigStore:
    """Istio config objects by kind, namespace and name.

    An update that changes neither spec, labels nor annotations raises no
    event, as istiod skips such updates. Snapshots are immutable views,
    copied only for kinds that changed since the last snapshot.
    """

    def __init__(self) -> None:
        self._by_kind: dict[Kind, dict[tuple[str, str], Config]] = {}
        self._handlers: list[tuple[Kind | None, ConfigHandler]] = []
        self._versions: dict[Kind, int] = {}
        self._snapshots: dict[Kind, tuple[int, KindView]] = {}
        self._batch_depth = 0
        self._batch_end_handlers: list[Callable[[], None]] = []

    def add_handler(self, handler: ConfigHandler, kind: Kind | None = None) -> None:
        """Call ``handler`` for every event of ``kind`` (all kinds if None)."""
        self._handlers.append((kind, handler))

    def add_batch_end_handler(self, handler: Callable[[], None]) -> None:
        """Call ``handler`` when the outermost ``batch`` ends (handlers that defer work do it then)."""
        self._batch_end_handlers.append(handler)

    @property
    def in_batch(self) -> bool:
        return self._batch_depth > 0

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Apply many objects: events are raised as usual, and handlers may defer to the batch's end
        what they would otherwise redo for every event (a file of 5,000 WorkloadEntries recomputed
        their ServiceEntries' endpoints once per entry, quadratic in the count)."""
        self._batch_depth += 1
        try:
            yield
        finally:
            self._batch_depth -= 1
            if self._batch_depth == 0:
                for handler in self._batch_end_handlers:
                    # Each handler runs whatever another does, and none hides the batch's own error.
                    try:
                        handler()
                    except Exception:
                        log.exception("applying the end of a config batch failed (%s)", handler)

    def get(self, kind: Kind, name: str, namespace: str) -> Config | None:
        return self._by_kind.get(kind, {}).get((namespace, name))

    def configs(self, kind: Kind, namespace: str | None = None) -> list[Config]:
        """Configs of a kind, oldest first (ties by namespace and name), as istiod orders them."""
        items = [
            c for c in self._by_kind.get(kind, {}).values() if namespace is None or c.namespace == namespace
        ]
        return sorted(items, key=config_order)

    def kinds(self) -> list[Kind]:
        return [k for k, v in self._by_kind.items() if v]

    def upsert(self, config: Config) -> ConfigEvent | None:
        objects = self._by_kind.setdefault(config.meta.kind, {})
        key = (config.namespace, config.name)
        old = objects.get(key)
        if old is not None and same(old, config):
            return None
        objects[key] = config
        self._bump(config.meta.kind)
        event = ConfigEvent(EventType.ADD if old is None else EventType.UPDATE, old, config)
        self._notify(event)
        return event

    def delete(self, key: ConfigKey) -> ConfigEvent | None:
        old = self._by_kind.get(key.kind, {}).pop((key.namespace, key.name), None)
        if old is None:
            return None
        self._bump(key.kind)
        event = ConfigEvent(EventType.DELETE, old, None)
        self._notify(event)
        return event

    def snapshot(self) -> dict[Kind, KindView]:
        """An immutable view of every kind, for a PushContext."""
        out = {}
        for kind, objects in self._by_kind.items():
            version = self._versions.get(kind, 0)
            cached = self._snapshots.get(kind)
            if cached is None or cached[0] != version:
                cached = (version, MappingProxyType(dict(objects)))
                self._snapshots[kind] = cached
            out[kind] = cached[1]
        return out

    def _bump(self, kind: Kind) -> None:
        self._versions[kind] = self._versions.get(kind, 0) + 1

    def _notify(self, event: ConfigEvent) -> None:
        kind = event.config.meta.kind
        for wanted, handler in self._handlers:
            if wanted is None or wanted is kind:
                handler(event)


def config_order(config: Config) -> tuple[str, str, str]:
    """Oldest first, then by namespace and name: how istiod breaks conflicts."""
    return (config.meta.creation_timestamp or "~", config.namespace, config.name)


def same(a: Config, b: Config) -> bool:
    """Whether writing ``b`` over ``a`` is no change (the store then raises no event)."""
    return (
        a.spec_hash == b.spec_hash
        and a.meta.labels == b.meta.labels
        and a.meta.annotations == b.meta.annotations
    )
