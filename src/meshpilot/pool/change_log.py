"""The main process's side of the change log: every change its sources make to the model, in order,
to every push worker; and the state in compact form, so that a worker that starts later (or again,
after a crash) catches up with a snapshot instead of the whole history.

After the start, the compact state is the one of the last push, and what was recorded since is
kept as it came: a worker that subscribes gets that state under that push's version, then the same
changes and pushes the other workers got. It never serves under a version a state the others did not
serve under it (changes not pushed yet would otherwise be in its first snapshot), and a batch still
open in the main process is open in the worker too (its end is yet to come)."""

from __future__ import annotations

import logging
import pickle
from collections import Counter
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
    JwksKeys,
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
#: Ops kept since the last push before the tail is coalesced (``coalesce``). Changes that push
#: nothing (a Pod's status churning) would otherwise grow it until the next push.
MAX_TAIL = 10_000


def encode(message: object) -> bytes:
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


class ChangeLog:
    def __init__(self) -> None:
        # The state at the last push recorded while no batch was open (before Start: at the last
        # moment none was), compacted.
        self._objects: dict[str, dict[ObjectKey, Decoded]] = {LOCAL: {}}
        self._mesh: Any = None
        self._authority: Authority | None = None
        self._jwks: JwksKeys | None = None
        self._start: Start | None = None
        #: What was recorded since that state, in order.
        self._tail: list[Op] = []
        #: The tail's length at which it is coalesced next (doubles when little could be folded).
        self._coalesce_at = MAX_TAIL
        #: The batches open, per target (a file's batch spans awaits; another source's may nest in it).
        self._open: Counter[str] = Counter()
        self._subscribers: dict[int, Send] = {}
        self._ids = 0
        #: The number of the last push recorded.
        self.push_seq = 0

    def record(self, op: Op) -> None:
        self._tail.append(op)
        if isinstance(op, BatchStart):
            self._open[op.target] += 1
        elif isinstance(op, BatchEnd):
            self._open[op.target] -= 1
        elif isinstance(op, Push):
            self.push_seq = op.seq
        # Before Start no worker serves, so any state will do to start from; after it, only the
        # state of a push. Never one in the middle of a batch: the batch's start would be folded
        # away, and its end, which comes live, would close nothing.
        settled = self._start is None or isinstance(op, Push | Start)
        if settled and not any(self._open.values()):
            for folded in self._tail:
                self._compact(folded)
            self._tail.clear()
            self._coalesce_at = MAX_TAIL
        elif len(self._tail) >= self._coalesce_at:
            self._tail = coalesce(self._tail)
            self._coalesce_at = max(MAX_TAIL, 2 * len(self._tail))
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
        objects of each (one batch per target) as of the last push and, once the main process has
        loaded, Start under that push's version; then what was recorded since, as it was."""
        if self._mesh is not None:
            yield Mesh(self._mesh)
        if self._authority is not None:
            yield self._authority
        if self._jwks is not None:
            yield self._jwks
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
            # The version of that push: the worker's first snapshot holds the same state.
            yield self._start
        yield from self._tail

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
        elif isinstance(op, JwksKeys):
            self._jwks = op
        elif isinstance(op, Start):
            self._start = op
        elif isinstance(op, Push) and op.version and self._start is not None:
            self._start = Start(op.version, op.seq, op.number)


def _object(op: Op) -> tuple[str, ObjectKey] | None:
    if isinstance(op, Upsert):
        return op.target, object_key(op.obj)
    if isinstance(op, Remove):
        return op.target, (op.kind, op.namespace, op.name)
    return None


def coalesce(tail: list[Op]) -> list[Op]:
    """``tail`` with only the last change of each object between two other ops (a push, a batch's
    start or end, ...): applied in order, it leaves a replica in the same state at each of those
    ops, and only the states between them, which no push saw, are skipped."""
    out: list[Op] = []
    run: dict[tuple[str, ObjectKey], Op] = {}
    for op in tail:
        key = _object(op)
        if key is None:
            out += run.values()
            run.clear()
            out.append(op)
        else:
            # Moved to the end: the objects keep the order of their last changes.
            run.pop(key, None)
            run[key] = op
    out += run.values()
    return out


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
