"""When a stream writes a generated response: after the other streams pushed in the same turn generated."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from meshpilot.xds.stream import Stream


def test_streams_pushed_in_one_turn_all_generate_before_any_writes() -> None:
    events: list[tuple[str, str]] = []
    observed: list[float] = []

    class Context:
        def __init__(self, name: str) -> None:
            self.name = name

        async def write(self, payload: bytes) -> None:
            events.append(("write", self.name))

    host = SimpleNamespace(metrics=SimpleNamespace(send_time=SimpleNamespace(observe=observed.append)))

    async def push(name: str) -> None:
        events.append(("generate", name))
        stream = cast(Any, SimpleNamespace(context=Context(name), host=host))
        await Stream._write(stream, b"response")

    async def both() -> None:
        await asyncio.gather(push("a"), push("b"), push("c"))

    asyncio.run(both())
    # One at a time, each write would follow its own generation: a, a, b, b, c, c.
    assert events == [("generate", n) for n in "abc"] + [("write", n) for n in "abc"]
    assert len(observed) == 3 and all(seconds >= 0 for seconds in observed)
