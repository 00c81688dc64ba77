"""The config store: events for real changes only, snapshots that do not change under a push."""

from __future__ import annotations

from meshpilot.config.decode import decode_object
from meshpilot.config.store import ConfigEvent, ConfigStore, EventType
from meshpilot.model.config import Config, ConfigKey
from meshpilot.model.kind import Kind


def vs(name: str, host: str, labels: dict[str, str] | None = None, created: str = "") -> Config:
    meta = {"name": name, "namespace": "default", "labels": labels or {}}
    if created:
        meta["creationTimestamp"] = created
    obj = decode_object(
        {
            "apiVersion": "networking.istio.io/v1",
            "kind": "VirtualService",
            "metadata": meta,
            "spec": {"hosts": [host], "http": [{"route": [{"destination": {"host": host}}]}]},
        }
    ).obj
    assert isinstance(obj, Config)
    return obj


def test_events_only_for_changes() -> None:
    store = ConfigStore()
    events: list[ConfigEvent] = []
    store.add_handler(events.append, Kind.VIRTUAL_SERVICE)
    store.add_handler(lambda e: (_ for _ in ()).throw(AssertionError("wrong kind")), Kind.GATEWAY)
    assert store.upsert(vs("a", "x")) is not None
    assert store.upsert(vs("a", "x")) is None, "same spec and labels: no event"
    assert store.upsert(vs("a", "x", {"k": "v"})) is not None, "a label change is a change"
    assert store.upsert(vs("a", "y", {"k": "v"})) is not None
    assert store.delete(ConfigKey(Kind.VIRTUAL_SERVICE, "a", "default")) is not None
    assert store.delete(ConfigKey(Kind.VIRTUAL_SERVICE, "a", "default")) is None
    assert [e.type for e in events] == [EventType.ADD, EventType.UPDATE, EventType.UPDATE, EventType.DELETE]


def test_snapshots_are_immutable_and_lists_are_ordered_oldest_first() -> None:
    store = ConfigStore()
    store.upsert(vs("b", "x", created="2024-01-02T00:00:00Z"))
    store.upsert(vs("a", "x", created="2024-01-03T00:00:00Z"))
    store.upsert(vs("c", "x"))
    snapshot = store.snapshot()
    store.upsert(vs("d", "x"))
    assert set(snapshot[Kind.VIRTUAL_SERVICE]) == {("default", "a"), ("default", "b"), ("default", "c")}
    assert [c.name for c in store.configs(Kind.VIRTUAL_SERVICE)] == ["b", "a", "c", "d"]
    again = store.snapshot()
    assert again[Kind.VIRTUAL_SERVICE] is store.snapshot()[Kind.VIRTUAL_SERVICE], (
        "unchanged kinds are not copied"
    )


def test_every_batch_end_handler_runs_even_if_one_fails() -> None:
    store = ConfigStore()
    ran: list[str] = []

    def failing() -> None:
        ran.append("failing")
        raise RuntimeError("broken handler")

    store.add_batch_end_handler(failing)
    store.add_batch_end_handler(lambda: ran.append("second"))
    with store.batch():
        with store.batch():
            pass
        assert ran == []  # only the outermost batch's end runs them
    assert ran == ["failing", "second"]
