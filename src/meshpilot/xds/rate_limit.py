"""A token bucket for new streams, as istiod limits them (golang's rate.Limiter with burst 1).

A caller reserves the next token; if that reservation lies further in the
future than it may wait, it is refused at once and consumes nothing.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable


def default_rate() -> float:
    """istiod's automatic limit: min(15 + 5 per CPU, 100) new streams per second."""
    return float(min(15 + 5 * (os.cpu_count() or 1), 100))


class TokenBucket:
    def __init__(
        self,
        rate: float,
        burst: int = 1,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._sleep = sleep
        self._tokens = float(burst)
        self._updated = clock()

    async def acquire(self, max_wait: float) -> bool:
        """Take a token, waiting at most ``max_wait`` seconds; False, taking nothing, if that is too short."""
        now = self._clock()
        tokens = min(float(self.burst), self._tokens + (now - self._updated) * self.rate)
        wait = 0.0 if tokens >= 1 else (1 - tokens) / self.rate
        if wait > max_wait:
            return False
        self._tokens = tokens - 1
        self._updated = now
        if wait > 0:
            await self._sleep(wait)
        return True
