"""A stream's events: requests before pushes, each kind in arrival order, one waiting reader."""

from __future__ import annotations

import asyncio

import pytest

from meshpilot.xds.stream_events import StreamEvents


async def test_requests_come_before_pushes_each_in_arrival_order() -> None:
    events: StreamEvents[str, str] = StreamEvents()
    events.put_push("push-1")
    events.put_request("ack-1")
    events.put_push("push-2")
    events.put_request("ack-2")
    taken = [await events.get() for _ in range(4)]
    assert taken == [("ack-1", None), ("ack-2", None), (None, "push-1"), (None, "push-2")]
    assert events.empty()


async def test_a_waiting_reader_wakes_for_either_kind() -> None:
    events: StreamEvents[str, str] = StreamEvents()
    reader = asyncio.create_task(events.get())
    await asyncio.sleep(0)
    assert not reader.done()
    events.put_push("push")
    assert await asyncio.wait_for(reader, 1) == (None, "push")
    reader = asyncio.create_task(events.get())
    await asyncio.sleep(0)
    events.put_request("request")
    assert await asyncio.wait_for(reader, 1) == ("request", None)


async def test_a_cancelled_reader_leaves_the_events_usable() -> None:
    events: StreamEvents[str, str] = StreamEvents()
    reader = asyncio.create_task(events.get())
    await asyncio.sleep(0)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    events.put_request("request")  # no waiter left to wake, and no error
    assert await asyncio.wait_for(events.get(), 1) == ("request", None)


def test_taking_the_pushes_drops_the_requests() -> None:
    events: StreamEvents[str, str] = StreamEvents()
    events.put_request("request")
    events.put_push("push-1")
    events.put_push("push-2")
    assert events.take_pushes() == ["push-1", "push-2"]
    assert events.empty()
