"""Push slots: at most the limit in flight, and a waiting push worker wakes when one is given back."""

from __future__ import annotations

import asyncio

import pytest

from meshpilot.push.throttle import PushSlots


async def test_the_limit_holds_until_a_slot_is_given_back() -> None:
    slots = PushSlots(2)
    slots.take()
    slots.take()
    assert slots.full
    waiting = asyncio.create_task(slots.wait())
    await asyncio.sleep(0)
    assert not waiting.done()
    slots.give_back()
    await asyncio.wait_for(waiting, 1)
    assert not slots.full
    slots.take()
    assert slots.full


async def test_a_cancelled_wait_leaves_the_slots_usable() -> None:
    slots = PushSlots(1)
    slots.take()
    waiting = asyncio.create_task(slots.wait())
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    slots.give_back()  # nobody waits: nothing to wake, and no error
    await asyncio.wait_for(slots.wait(), 1)
    assert slots.busy == 0
