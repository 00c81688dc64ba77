"""What a stream's loop handles next: requests (and the stream's end) before pushes, each in order.

Every push to every proxy goes through here, so it is two deques and the one reader's future
rather than an ``asyncio.PriorityQueue``, whose heap, sequence numbers, task accounting and waiter
lists cost more per item for an order this simple. Not an ``asyncio.Event`` either: its wait checks
the loop in Python and keeps a list of waiters for the one reader there is, on every wake-up of
every stream of a push.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

R = TypeVar("R")
P = TypeVar("P")


class StreamEvents(Generic[R, P]):
    """Requests of type ``R`` and pushes of type ``P`` for one reader, the stream's loop."""

    __slots__ = ("_pushes", "_requests", "_waiter")

    def __init__(self) -> None:
        self._requests: deque[R] = deque()
        self._pushes: deque[P] = deque()
        #: What the reader awaits while there is nothing: done by the next put.
        self._waiter: asyncio.Future[None] | None = None

    def empty(self) -> bool:
        return not self._requests and not self._pushes

    def __len__(self) -> int:
        """Requests and pushes not yet taken."""
        return len(self._requests) + len(self._pushes)

    def put_request(self, item: R) -> None:
        """Handled before any push not yet taken; requests in the order they came."""
        self._requests.append(item)
        self._wake()

    def put_push(self, item: P) -> None:
        self._pushes.append(item)
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def get(self) -> tuple[R | None, P | None]:
        """The next request, else the next push (the other None); waits while there is neither.
        One reader at a time."""
        while True:
            if self._requests:
                return self._requests.popleft(), None
            if self._pushes:
                return None, self._pushes.popleft()
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                # Woken, or cancelled (the stream ends): either way no put should wake it again.
                if self._waiter is waiter:
                    self._waiter = None

    def take_pushes(self) -> list[P]:
        """Every push not yet taken, and nothing else is left: a stream that ends drops its requests."""
        pushes = list(self._pushes)
        self._requests.clear()
        self._pushes.clear()
        return pushes
