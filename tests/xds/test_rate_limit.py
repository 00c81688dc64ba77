"""The token bucket for new streams: burst 1, a bounded wait, refusals that take nothing."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
from multiprocessing.queues import Queue
from multiprocessing.sharedctypes import SynchronizedArray

from meshpilot.xds.rate_limit import SharedState, TokenBucket


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


async def test_burst_then_paced_then_refused() -> None:
    clock = Clock()
    bucket = TokenBucket(2.0, clock=clock, sleep=clock.sleep)
    assert await bucket.acquire(1.0)
    assert clock.slept == []
    assert await bucket.acquire(1.0), "the next token comes in 0.5s, within the wait"
    assert clock.slept == [0.5]
    clock.now -= 0.5  # as if the sleep had not happened yet: the next token is 1s away
    assert await bucket.acquire(1.0)
    refused_at = clock.now
    assert not await bucket.acquire(0.1), "a token further away than the wait is refused"
    assert clock.now == refused_at, "a refusal does not wait"
    clock.now += 10
    assert await bucket.acquire(0.0), "a refusal took nothing"


async def test_real_time_pacing() -> None:
    bucket = TokenBucket(50.0)
    started = asyncio.get_running_loop().time()
    results = [await bucket.acquire(1.0) for _ in range(5)]
    assert results == [True] * 5
    assert asyncio.get_running_loop().time() - started >= 0.07


def _take_one(array: SynchronizedArray[float], results: Queue[bool]) -> None:
    """In another process: take a token from the shared bucket, without waiting."""
    results.put(asyncio.run(TokenBucket(0.01, state=SharedState(array)).acquire(0.0)))


def test_a_shared_bucket_is_one_limit_across_processes() -> None:
    context = multiprocessing.get_context("spawn")
    state = SharedState.create(context)
    results: Queue[bool] = context.Queue()
    child = context.Process(target=_take_one, args=(state.array, results))
    child.start()
    child.join(30)
    assert results.get(timeout=5) is True, "the other process took the one token"
    # One token in 100 s: this process finds the bucket empty, as if it had taken the token itself.
    assert not asyncio.run(TokenBucket(0.01, state=state).acquire(0.1))
    local = TokenBucket(0.01)
    assert asyncio.run(local.acquire(0.0)), "a bucket of its own is not affected"
    # A lock nobody releases (its holder was killed): the stream is admitted, the loop not held.
    holder = threading.Thread(target=state.array.get_lock().acquire)
    holder.start()
    holder.join()
    assert asyncio.run(TokenBucket(0.01, state=state).acquire(0.0))
