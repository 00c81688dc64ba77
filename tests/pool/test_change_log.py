"""The change log's record, its compacted snapshot and the sink that feeds it."""

from __future__ import annotations

import pickle
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from meshpilot.config.decode import Decoded, decode_object
from meshpilot.model.config import Config
from meshpilot.model.kind import Kind
from meshpilot.model.push_request import PushRequest, TriggerReason
from meshpilot.pool import change_log
from meshpilot.pool.change_log import ChangeLog, LoggedSink
from meshpilot.pool.ops import (
    LOCAL,
    Attach,
    BatchEnd,
    BatchStart,
    Detach,
    Mesh,
    Push,
    Remove,
    Start,
    Upsert,
)


def service_entry(name: str, host: str) -> Decoded:
    raw: dict[str, Any] = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"hosts": [host], "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}]},
    }
    return decode_object(raw).obj


class RecordingSink:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def upsert(self, obj: Decoded) -> None:
        self.calls.append(("upsert", obj.meta.name))

    def remove(self, kind: Kind, namespace: str, name: str) -> None:
        self.calls.append(("remove", name))

    @contextmanager
    def batch(self) -> Iterator[None]:
        self.calls.append(("batch",))
        yield
        self.calls.append(("end",))


def received(log: ChangeLog) -> list[object]:
    messages: list[object] = []
    log.subscribe(lambda data: messages.append(pickle.loads(data)))
    return messages


def test_sink_applies_then_records_in_order() -> None:
    log = ChangeLog()
    messages = received(log)
    inner = RecordingSink()
    sink = LoggedSink(inner, log)
    with sink.batch():
        sink.upsert(service_entry("a", "a.example.com"))
        sink.remove(Kind.SERVICE_ENTRY, "default", "a")
    assert inner.calls == [("batch",), ("upsert", "a"), ("remove", "a"), ("end",)]
    assert [type(m) for m in messages] == [BatchStart, Upsert, Remove, BatchEnd]
    upsert = messages[1]
    assert isinstance(upsert, Upsert) and upsert.target == LOCAL and upsert.obj.meta.name == "a"


def test_batch_end_recorded_when_the_batch_fails() -> None:
    log = ChangeLog()
    messages = received(log)
    sink = LoggedSink(RecordingSink(), log)
    try:
        with sink.batch():
            raise RuntimeError("a source failed mid-sync")
    except RuntimeError:
        pass
    # A worker must not be left inside a batch that never ends.
    assert [type(m) for m in messages] == [BatchStart, BatchEnd]


def test_snapshot_holds_only_the_latest_state() -> None:
    log = ChangeLog()
    sink = LoggedSink(RecordingSink(), log)
    log.record(Mesh({"mesh": 1}))
    sink.upsert(service_entry("a", "a.example.com"))
    sink.upsert(service_entry("b", "b.example.com"))
    sink.upsert(service_entry("b", "b2.example.com"))
    sink.remove(Kind.SERVICE_ENTRY, "default", "a")
    log.record(Mesh({"mesh": 2}))
    remote = LoggedSink(RecordingSink(), log, "west")
    log.record(Attach("west"))
    remote.upsert(service_entry("c", "c.example.com"))
    snapshot = list(log.snapshot())
    assert snapshot[0] == Mesh({"mesh": 2})
    upserts = [(op.target, op.obj.meta.name) for op in snapshot if isinstance(op, Upsert)]
    assert upserts == [(LOCAL, "b"), ("west", "c")]
    latest = next(op for op in snapshot if isinstance(op, Upsert) and op.obj.meta.name == "b")
    assert isinstance(latest, Upsert) and isinstance(latest.obj, Config)
    assert "b2.example.com" in str(latest.obj.spec)
    assert Attach("west") in snapshot
    # Not loaded yet: a worker that starts now must wait for Start.
    assert not any(isinstance(op, Start) for op in snapshot)
    log.record(Detach("west"))
    assert [op.target for op in log.snapshot() if isinstance(op, BatchStart)] == [LOCAL]


def test_start_follows_the_latest_push() -> None:
    log = ChangeLog()
    log.record(Start("v1", 0))
    request = PushRequest(full=True, reasons=Counter({TriggerReason.CONFIG: 1}))
    request.push = None
    log.record(Push(1, "v2", True, False, frozenset(), dict(request.reasons), number=4))
    assert log.push_seq == 1
    # The push's record number too: a worker starting from here names its own pushes after it.
    assert list(log.snapshot())[-1] == Start("v2", 1, 4)


def test_subscriber_gets_snapshot_then_live_changes_until_it_leaves() -> None:
    log = ChangeLog()
    sink = LoggedSink(RecordingSink(), log)
    sink.upsert(service_entry("a", "a.example.com"))
    messages: list[object] = []
    subscription = log.subscribe(lambda data: messages.append(pickle.loads(data)))
    assert [type(m) for m in messages] == [BatchStart, Upsert, BatchEnd]
    sink.upsert(service_entry("b", "b.example.com"))
    assert isinstance(messages[-1], Upsert) and messages[-1].obj.meta.name == "b"
    log.unsubscribe(subscription)
    sink.upsert(service_entry("c", "c.example.com"))
    assert len(messages) == 4


def test_a_tail_without_pushes_stays_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Changes that push nothing (a Pod's status churning) are coalesced once the tail is long: each
    object's last change between two other ops, in the order of those last changes."""
    monkeypatch.setattr(change_log, "MAX_TAIL", 50)
    log = ChangeLog()
    log.record(Start("v1", 0))
    sink = LoggedSink(RecordingSink(), log)
    for round_ in range(100):
        for name in ("a", "b", "c"):
            sink.upsert(service_entry(name, f"{name}{round_}.example.com"))
    tail = list(log.snapshot())[1:]  # after Start
    assert len(tail) <= 50
    assert [op.obj.meta.name for op in tail if isinstance(op, Upsert)][-3:] == ["a", "b", "c"]
    last = {op.obj.meta.name: str(op.obj.spec) for op in tail if isinstance(op, Upsert)}
    assert all(f"{name}99.example.com" in spec for name, spec in last.items())
    # A push folds the tail into the snapshot as before.
    log.record(Push(1, "v2", True, False, frozenset(), {TriggerReason.CONFIG: 1}))
    assert list(log.snapshot())[-1] == Start("v2", 1)


def test_coalescing_keeps_what_separates_runs() -> None:
    a1, a2, b = service_entry("a", "a1.example"), service_entry("a", "a2.example"), service_entry("b", "b")
    remove_a = Remove(LOCAL, Kind.SERVICE_ENTRY, "default", "a")
    push = Push(1, "v2", False, False, frozenset(), {TriggerReason.ENDPOINT: 1})
    tail = [
        Upsert(LOCAL, a1),
        Upsert(LOCAL, b),
        Upsert(LOCAL, a2),
        push,
        BatchStart(LOCAL),
        Upsert(LOCAL, a1),
        remove_a,
        BatchEnd(LOCAL),
        Upsert("west", a1),
        Upsert(LOCAL, a2),
    ]
    assert change_log.coalesce(tail) == [
        Upsert(LOCAL, b),
        Upsert(LOCAL, a2),
        push,
        BatchStart(LOCAL),
        remove_a,
        BatchEnd(LOCAL),
        Upsert("west", a1),
        Upsert(LOCAL, a2),
    ]
