"""Debounce: merge bursts of change events into one push.

A push starts once no event arrived for ``quiet`` seconds, or ``max_delay``
seconds after the first event of the burst, whichever comes first. Only one
push runs at a time; events arriving meanwhile form the next burst. This is
a free function with its push function and clock passed in, so tests can
drive it without waiting for real time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from meshpilot.model.push_request import PushRequest, merge_all

PushFn = Callable[[PushRequest], Coroutine[Any, Any, None]]


@dataclass(frozen=True, slots=True)
class DebounceOptions:
    quiet: float = 0.1
    max_delay: float = 10.0


@dataclass(frozen=True, slots=True)
class Debounced:
    """How a burst ended: the events it merged, and seconds since its last and its first event."""

    events: int
    since_last: float
    since_first: float


async def debounce(
    events: asyncio.Queue[PushRequest],
    push: PushFn,
    options: DebounceOptions,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    on_debounced: Callable[[PushRequest, Debounced], None] | None = None,
) -> None:
    """Run until cancelled; ``on_debounced(merged_request, how)`` observes each push as it starts.

    ``clock`` and ``sleep`` measure and wait in the same time, so a test can
    pass a fake pair.
    """
    #: The burst so far, merged when it is pushed (merge_all: one union, not one per event).
    pending: list[PushRequest] = []
    first_at = last_at = 0.0
    running: asyncio.Task[None] | None = None
    getter: asyncio.Task[PushRequest] | None = None
    timer: asyncio.Future[None] | None = None
    try:
        while True:
            timeout: float | None = None
            if pending and running is None:
                now = clock()
                due = min(last_at + options.quiet, first_at + options.max_delay)
                if now >= due:
                    merged = merge_all(pending)
                    if on_debounced is not None:
                        on_debounced(merged, Debounced(len(pending), now - last_at, now - first_at))
                    running = asyncio.create_task(push(merged))
                    pending = []
                    continue
                timeout = due - now
            if getter is None:
                getter = asyncio.create_task(events.get())
            waiters: set[asyncio.Future[Any]] = {getter}
            if running is not None:
                waiters.add(running)
            if timeout is not None:
                timer = asyncio.ensure_future(sleep(timeout))
                waiters.add(timer)
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            if timer is not None:
                timer.cancel()
                timer = None
            if running is not None and running.done():
                if not running.cancelled():
                    running.exception()  # retrieved here; push() logs its own failures
                running = None
            if getter.done():
                request = getter.result()
                getter = None
                last_at = clock()
                if not pending:
                    first_at = last_at
                pending.append(request)
                # Take what else is queued now: one wake-up per burst, not one task per event.
                while not events.empty():
                    pending.append(events.get_nowait())
    finally:
        for task in (running, getter, timer):
            if task is not None:
                task.cancel()
