"""The server's garbage-collector settings: defaults, the environment override, bad values ignored, and
full collections paced by ended streams."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Iterator

import pytest

from meshpilot.server import gc_tuning


@pytest.fixture(autouse=True)
def restore() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(gc_tuning.ENV, raising=False)
    assert gc_tuning.configure() == gc_tuning.DEFAULT_THRESHOLDS
    assert gc.get_threshold() == gc_tuning.DEFAULT_THRESHOLDS


def test_environment_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(gc_tuning.ENV, "700,10,10")
    assert gc_tuning.configure() == (700, 10, 10)
    assert gc.get_threshold() == (700, 10, 10)


@pytest.mark.parametrize("raw", ["fast", "1,2,3,4", "-5", "1,,2"])
def test_bad_values_are_ignored(
    monkeypatch: pytest.MonkeyPatch, raw: str, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(gc_tuning.ENV, raw)
    assert gc_tuning.configure() == gc_tuning.DEFAULT_THRESHOLDS
    assert gc_tuning.ENV in caplog.text


async def test_full_collections_follow_ended_streams() -> None:
    """A batch of ended streams brings a full collection (not more than one per interval), and what
    is left after a flood is collected once it ends."""
    # Spaced by the interval alone (a slow real collection must not stretch it: see the next tests).
    ended = gc_tuning.EndedStreams(every=100, min_interval=1.0, time_share=1.0)
    for _ in range(100):
        ended.ended()
    await asyncio.sleep(0)  # scheduled, not run inside the stream's own exception handling
    await asyncio.sleep(0)
    assert ended.collections == 1
    for _ in range(100):
        ended.ended()  # within the interval: the next one waits for the timer
    await asyncio.sleep(0)
    assert ended.collections == 1
    await asyncio.sleep(1.2)
    assert ended.collections == 2
    for _ in range(9):
        ended.ended()  # fewer than a tenth of `every`: no collection for these alone
    await asyncio.sleep(1.2)
    assert ended.collections == 2


async def test_a_cycle_left_by_ended_streams_is_freed() -> None:
    """What the collections are for: a reference cycle holding a large buffer (as grpc's call state
    and an abort's traceback do) is freed after the streams end, not at some later full collection."""
    import weakref

    class Held:
        def __init__(self) -> None:
            self.me = self
            self.payload = bytearray(1 << 20)

    gc.collect()
    gc.disable()  # only the collection under test may free it
    try:
        held = Held()
        alive = weakref.ref(held)
        del held
        ended = gc_tuning.EndedStreams(every=10, min_interval=0.0)
        for _ in range(10):
            ended.ended()
        assert alive() is not None
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert alive() is None
    finally:
        gc.enable()


def test_ends_while_a_collection_is_queued_queue_no_other(monkeypatch: pytest.MonkeyPatch) -> None:
    """Streams that end before the queued collection runs wait for it: a reconnect storm queues one
    collection, not one per end past the threshold (which would run them back to back)."""

    class Loop:
        def __init__(self) -> None:
            self.queued: list[object] = []

        def call_soon(self, callback: object) -> None:
            self.queued.append(callback)

        def call_later(self, delay: float, callback: object) -> object:
            return None

    loop = Loop()
    monkeypatch.setattr(gc_tuning.asyncio, "get_running_loop", lambda: loop)
    ended = gc_tuning.EndedStreams(every=10, min_interval=0.0)
    for _ in range(50):
        ended.ended()
    assert len(loop.queued) == 1


def test_a_slow_full_collection_spaces_the_next_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """A collection's cost grows with the fleet's state: the next one waits its duration over the time
    share (up to the cap), so a storm of refused streams cannot keep the interpreter collecting."""
    clock = [100.0]

    class Loop:
        def __init__(self) -> None:
            self.soon: list[Callable[[], None]] = []
            self.later: list[float] = []

        def call_soon(self, callback: Callable[[], None]) -> None:
            self.soon.append(callback)

        def call_later(self, delay: float, callback: object) -> Handle:
            self.later.append(delay)
            return Handle()

    class Handle:
        def cancel(self) -> None:
            pass

    def collect(took: float) -> Callable[[], int]:
        def run() -> int:
            clock[0] += took
            return 0

        return run

    loop = Loop()
    monkeypatch.setattr(gc_tuning.asyncio, "get_running_loop", lambda: loop)
    monkeypatch.setattr(gc_tuning.time, "monotonic", lambda: clock[0])
    ended = gc_tuning.EndedStreams(every=10, min_interval=2.0, time_share=0.05, max_interval=10.0)
    for took, spacing in ((0.2, 4.0), (0.05, 2.0), (0.8, 10.0)):
        monkeypatch.setattr(gc_tuning.gc, "collect", collect(took))
        for _ in range(10):
            ended.ended()
        loop.soon.pop()()  # the collection, queued once the threshold is reached
        assert not loop.soon
        loop.later.clear()
        clock[0] += spacing - 0.01
        for _ in range(10):
            ended.ended()
        assert not loop.soon, f"{took} s collection: the next waits {spacing} s"
        assert loop.later == [pytest.approx(spacing)], "the leftovers' timer waits the same spacing"
        clock[0] += 0.02
    assert ended.collections == 3
