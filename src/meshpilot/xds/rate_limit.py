"""A token bucket for new streams, as istiod limits them (golang's rate.Limiter with burst 1).

A caller reserves the next token; if that reservation lies further in the
future than it may wait, it is refused at once and consumes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager
from multiprocessing.context import BaseContext
from multiprocessing.sharedctypes import SynchronizedArray
from typing import Protocol


def default_rate() -> float:
    """istiod's automatic limit: min(15 + 5 per CPU, 100) new streams per second."""
    return float(min(15 + 5 * (os.cpu_count() or 1), 100))


#: How long a worker waits for the shared bucket's lock before it admits the stream anyway: a process
#: killed while holding it would otherwise hang every worker's event loop. A rate limit, not a check.
SHARED_LOCK_WAIT = 0.05


class BucketState(Protocol):
    """Where a bucket keeps its tokens and when it last counted them; ``lock`` guards both and
    yields whether it is held."""

    tokens: float
    updated: float

    def lock(self) -> AbstractContextManager[bool]: ...


class LocalState:
    """One process's bucket."""

    def __init__(self, tokens: float, updated: float) -> None:
        self.tokens = tokens
        self.updated = updated

    def lock(self) -> AbstractContextManager[bool]:
        return contextlib.nullcontext(True)


class SharedState:
    """A bucket shared by processes (a push-worker pool's: the limit is the server's, not each
    worker's). Two doubles in shared memory under their lock; ``time.monotonic`` is one clock for
    every process of a machine."""

    def __init__(self, array: SynchronizedArray[float]) -> None:
        self._array = array

    @classmethod
    def create(cls, context: BaseContext, burst: int = 1) -> SharedState:
        return cls(context.Array("d", [float(burst), time.monotonic()]))

    @property
    def array(self) -> SynchronizedArray[float]:
        """What another process is given to share the bucket (``SharedState(array)`` there)."""
        return self._array

    @property
    def tokens(self) -> float:
        return float(self._array[0])

    @tokens.setter
    def tokens(self, value: float) -> None:
        self._array[0] = value

    @property
    def updated(self) -> float:
        return float(self._array[1])

    @updated.setter
    def updated(self, value: float) -> None:
        self._array[1] = value

    @contextlib.contextmanager
    def lock(self) -> Iterator[bool]:
        lock = self._array.get_lock()
        held = lock.acquire(timeout=SHARED_LOCK_WAIT)
        try:
            yield held
        finally:
            if held:
                lock.release()


class TokenBucket:
    def __init__(
        self,
        rate: float,
        burst: int = 1,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        state: BucketState | None = None,
    ) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._sleep = sleep
        self._state = state if state is not None else LocalState(float(burst), clock())

    async def acquire(self, max_wait: float) -> bool:
        """Take a token, waiting at most ``max_wait`` seconds; False, taking nothing, if that is too short."""
        state = self._state
        with state.lock() as held:
            if not held:
                return True
            now = self._clock()
            tokens = min(float(self.burst), state.tokens + (now - state.updated) * self.rate)
            wait = 0.0 if tokens >= 1 else (1 - tokens) / self.rate
            if wait > max_wait:
                return False
            state.tokens = tokens - 1
            state.updated = now
        if wait > 0:
            await self._sleep(wait)
        return True
