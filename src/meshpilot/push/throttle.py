"""How many pushes may be in flight at once (istiod's PILOT_PUSH_THROTTLE), for one taker: the
server's push worker.

Not an ``asyncio.Semaphore``: its ``acquire`` asks ``locked()``, which walks the waiters with a
generator, and is a coroutine even when a slot is free; this is taken once per proxy of every push.
A count and an ``asyncio.Event`` for the one taker to wait on when it is full.
"""

from __future__ import annotations

import asyncio


class PushSlots:
    __slots__ = ("_freed", "busy", "limit")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            # Never a worker waiting for ever on a throttle no push can pass.
            raise ValueError(f"the push throttle must be at least 1, not {limit}")
        self.limit = limit
        self.busy = 0
        self._freed = asyncio.Event()

    @property
    def full(self) -> bool:
        return self.busy >= self.limit

    async def wait(self) -> None:
        """Until a slot is free (``full`` is False)."""
        while self.busy >= self.limit:
            self._freed.clear()
            await self._freed.wait()

    def take(self) -> None:
        assert self.busy < self.limit, "wait() first"
        self.busy += 1

    def give_back(self) -> None:
        assert self.busy > 0, "a slot given back twice"
        self.busy -= 1
        self._freed.set()
