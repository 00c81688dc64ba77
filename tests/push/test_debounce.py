"""Debounce on a fake clock: quiet period, maximum delay, one push at a time."""

from __future__ import annotations

import asyncio

from meshpilot.model.config import ConfigKey
from meshpilot.model.kind import Kind
from meshpilot.model.push_request import PushRequest
from meshpilot.push.debounce import DebounceOptions, debounce


class FakeClock:
    """Time that moves only when the test says; sleepers wake when it passes their deadline."""

    def __init__(self) -> None:
        self._now = 0.0
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def __call__(self) -> float:
        return self._now

    @property
    def now(self) -> float:
        return self._now

    @now.setter
    def now(self, value: float) -> None:
        self._now = value
        for deadline, future in self._sleepers:
            if deadline <= value and not future.done():
                future.set_result(None)

    async def sleep(self, delay: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((self._now + delay, future))
        await future


def req(name: str) -> PushRequest:
    return PushRequest(configs_updated=frozenset({ConfigKey(Kind.VIRTUAL_SERVICE, name, "ns")}))


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_burst_becomes_one_push_after_the_quiet_period() -> None:
    clock = FakeClock()
    events: asyncio.Queue[PushRequest] = asyncio.Queue()
    pushed: list[PushRequest] = []

    async def push(request: PushRequest) -> None:
        pushed.append(request)

    task = asyncio.create_task(
        debounce(events, push, DebounceOptions(quiet=1.0, max_delay=10.0), clock=clock, sleep=clock.sleep)
    )
    for name in ("a", "b", "c"):
        events.put_nowait(req(name))
        await settle()
        clock.now += 0.5
    await settle()
    assert pushed == [], "still within the quiet period"
    clock.now += 0.6
    await settle()
    assert len(pushed) == 1
    assert {k.name for k in pushed[0].configs_updated} == {"a", "b", "c"}
    task.cancel()


async def test_continuous_changes_push_at_the_maximum_delay() -> None:
    clock = FakeClock()
    events: asyncio.Queue[PushRequest] = asyncio.Queue()
    pushed: list[PushRequest] = []

    async def push(request: PushRequest) -> None:
        pushed.append(request)

    task = asyncio.create_task(
        debounce(events, push, DebounceOptions(quiet=1.0, max_delay=3.0), clock=clock, sleep=clock.sleep)
    )
    for i in range(8):
        events.put_nowait(req(f"v{i}"))
        await settle()
        clock.now += 0.5
    await settle()
    assert len(pushed) == 1, "the maximum delay forces a push despite constant change"
    assert len(pushed[0].configs_updated) == 7
    task.cancel()


async def test_only_one_push_runs_at_a_time() -> None:
    clock = FakeClock()
    events: asyncio.Queue[PushRequest] = asyncio.Queue()
    started: list[PushRequest] = []
    release = asyncio.Event()

    async def push(request: PushRequest) -> None:
        started.append(request)
        await release.wait()

    task = asyncio.create_task(
        debounce(events, push, DebounceOptions(quiet=0.1, max_delay=1.0), clock=clock, sleep=clock.sleep)
    )
    events.put_nowait(req("a"))
    await settle()
    clock.now += 0.2
    await settle()
    assert len(started) == 1
    events.put_nowait(req("b"))
    await settle()
    clock.now += 5
    await settle()
    assert len(started) == 1, "the next push waits for the running one"
    release.set()
    await settle()
    assert len(started) == 2
    assert {k.name for k in started[1].configs_updated} == {"b"}
    task.cancel()
