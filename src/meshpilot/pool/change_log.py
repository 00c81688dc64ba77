"""The main process's side of the change log: every change its sources make to the model, in order,
to every push worker; and the current state in compact form, so that a worker that starts later (or
again, after a crash) catches up with a snapshot instead of the whole history."""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from meshpilot.config.decode import Decoded
from meshpilot.config.file_loader import ObjectKey, object_key
from meshpilot.config.file_source import ObjectSink
from meshpilot.model.kind import Kind
from meshpilot.pool.ops import (
    LOCAL,
    Attach,
    Authority,
    BatchEnd,
    BatchStart,
    Detach,
    Mesh,
    Op,
    Push,
    Remove,
    Start,
    Upsert,
)

log = logging.getLogger(__name__)

#: Where a subscriber's messages go: already pickled, so that an op is pickled once for all workers.
Send = Callable[[bytes], None]


def encode(message: object) -> bytes:
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


class ChangeLog:
    def __init__(self) -> None:
        self._objects: dict[str, dict[ObjectKey, Decoded]] = {LOCAL: {}}
        self._mesh: Any = None
        self._authority: Authority | None = None
        self._start: Start | None = None
        self._subscribers: dict[int, Send] = {}
        self._ids = 0
        #: The number of the last push recorded.
        self.push_seq = 0

    def record(self, op: Op) -> None:
        self._compact(op)
        data = encode(op)
        for send in list(self._subscribers.values()):
            send(data)

    def subscribe(self, send: Send) -> int:
        """Send the current state, then every op from now on; the subscription's ID."""
        for op in self.snapshot():
            send(encode(op))
        self._ids += 1
        self._subscribers[self._ids] = send
        return self._ids

    def unsubscribe(self, subscription: int) -> None:
        self._subscribers.pop(subscription, None)

    def snapshot(self) -> Iterator[Op]:
        """What a new worker applies to hold the current model: the mesh, the CA, the clusters, the
        objects of each (one batch per target) and, once the main process has loaded, Start."""
        if self._mesh is not None:
            yield Mesh(self._mesh)
        if self._authority is not None:
            yield self._authority
        for target, objects in self._objects.items():
            if target != LOCAL:
                yield Attach(target)
            if not objects:
                continue
            yield BatchStart(target)
            for obj in objects.values():
                yield Upsert(target, obj)
            yield BatchEnd(target)
        if self._start is not None:
            # The version of the latest snapshot: the worker's first one holds the same state.
            yield Start(self._start.version, self.push_seq)

    def _compact(self, op: Op) -> None:
        if isinstance(op, Upsert):
            self._objects[op.target][object_key(op.obj)] = op.obj
        elif isinstance(op, Remove):
            self._objects[op.target].pop((op.kind, op.namespace, op.name), None)
        elif isinstance(op, Attach):
            self._objects.setdefault(op.cluster, {})
        elif isinstance(op, Detach):
            self._objects.pop(op.cluster, None)
        elif isinstance(op, Mesh):
            self._mesh = op.mesh
        elif isinstance(op, Authority):
            self._authority = op
        elif isinstance(op, Start):
            self._start = op
        elif isinstance(op, Push):
            self.push_seq = op.seq
            if op.version and self._start is not None:
                self._start = Start(op.version, op.seq)


class LoggedSink:
    """A source's sink that also records what it applies (the main process of a pool)."""

    def __init__(self, sink: ObjectSink, changes: ChangeLog, target: str = LOCAL) -> None:
        self._sink = sink
        self._log = changes
        self._target = target

    def upsert(self, obj: Decoded) -> None:
        self._sink.upsert(obj)
        self._log.record(Upsert(self._target, obj))

    def remove(self, kind: Kind, namespace: str, name: str) -> None:
        self._sink.remove(kind, namespace, name)
        self._log.record(Remove(self._target, kind, namespace, name))

    @contextmanager
    def batch(self) -> Iterator[None]:
        self._log.record(BatchStart(self._target))
        try:
            with self._sink.batch():
                yield
        finally:
            self._log.record(BatchEnd(self._target))
