"""The push queue: one pending merged request per connection, also while a push is in flight."""

from __future__ import annotations

import asyncio

from meshpilot.model.config import ConfigKey
from meshpilot.model.kind import Kind
from meshpilot.model.push_request import PushRequest
from meshpilot.push.queue import PushQueue


def req(name: str, full: bool = False) -> PushRequest:
    return PushRequest(full=full, configs_updated=frozenset({ConfigKey(Kind.SERVICE_ENTRY, name, "ns")}))


async def test_fifo_and_merge_while_waiting() -> None:
    queue: PushQueue[str] = PushQueue()
    queue.enqueue("a", req("x"))
    queue.enqueue("b", req("y"))
    queue.enqueue("a", req("z", full=True))
    assert len(queue) == 2
    key, merged = await queue.dequeue()  # type: ignore[misc]
    assert key == "a"
    assert merged.full and {k.name for k in merged.configs_updated} == {"x", "z"}
    key, _ = await queue.dequeue()  # type: ignore[misc]
    assert key == "b"


async def test_changes_during_a_push_requeue_once_done() -> None:
    queue: PushQueue[str] = PushQueue()
    queue.enqueue("a", req("x"))
    key, _ = await queue.dequeue()  # type: ignore[misc]
    queue.enqueue("a", req("y"))
    queue.enqueue("a", req("z"))
    assert len(queue) == 0, "not queued twice while in flight"
    queue.mark_done("a")
    key, later = await queue.dequeue()  # type: ignore[misc]
    assert key == "a" and {k.name for k in later.configs_updated} == {"y", "z"}
    queue.mark_done("a")
    assert len(queue) == 0


async def test_remove_and_close() -> None:
    queue: PushQueue[str] = PushQueue()
    queue.enqueue("a", req("x"))
    queue.remove("a")
    assert len(queue) == 0
    waiter = asyncio.create_task(queue.dequeue())
    await asyncio.sleep(0)
    queue.close()
    assert await asyncio.wait_for(waiter, 1) is None


async def test_idle_only_with_nothing_queued_or_in_flight() -> None:
    queue: PushQueue[str] = PushQueue()
    assert queue.idle
    queue.enqueue("a", req("x"))
    assert not queue.idle
    await queue.dequeue()
    assert not queue.idle, "a push in flight"
    queue.enqueue("a", req("y"))
    queue.mark_done("a")
    assert not queue.idle, "queued again by what arrived meanwhile"
    await queue.dequeue()
    queue.mark_done("a")
    assert queue.idle
