"""The push queue: at most one pending push per connection, merged, also while one is in flight.

A connection waits in FIFO order. Enqueueing a connection that is already
waiting merges the requests; enqueueing one that is being pushed merges
into a request that re-queues the connection when its push is done, so a
change during a push is never lost and never pushed twice concurrently.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

from meshpilot.model.push_request import PushRequest

K = TypeVar("K")


class PushQueue(Generic[K]):
    def __init__(self) -> None:
        self._order: deque[K] = deque()
        self._pending: dict[K, PushRequest] = {}
        #: Connections being pushed, with what arrived meanwhile (None: nothing).
        self._in_flight: dict[K, PushRequest | None] = {}
        self._ready = asyncio.Event()
        self._closed = False

    def __len__(self) -> int:
        return len(self._order)

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing being pushed."""
        return not self._order and not self._in_flight

    def enqueue(self, key: K, request: PushRequest) -> None:
        if key in self._in_flight:
            later = self._in_flight[key]
            self._in_flight[key] = request if later is None else later.merge(request)
            return
        existing = self._pending.get(key)
        if existing is not None:
            self._pending[key] = existing.merge(request)
            return
        self._pending[key] = request
        self._order.append(key)
        self._ready.set()

    async def dequeue(self) -> tuple[K, PushRequest] | None:
        """The next connection and its merged request; None once the queue is closed."""
        while not self._order:
            if self._closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        key = self._order.popleft()
        request = self._pending.pop(key)
        self._in_flight[key] = None
        return key, request

    def mark_done(self, key: K) -> None:
        """The push to ``key`` finished; re-queue it if more changes arrived meanwhile."""
        later = self._in_flight.pop(key, None)
        if later is not None:
            self.enqueue(key, later)

    def remove(self, key: K) -> None:
        """Forget a closed connection."""
        self._in_flight.pop(key, None)
        if self._pending.pop(key, None) is not None:
            self._order.remove(key)

    def close(self) -> None:
        self._closed = True
        self._ready.set()
