"""Questions over a pool's pipes, both ways: the main process asks its workers (their debug pages,
their metrics) and a worker asks the main process (the whole pool's answer to a debug request that
reached it). Each side keeps a table of handlers by name; a ``Call`` is answered by a ``Reply``
carrying the handler's value or its error, and the asker matches replies to calls by ID."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from meshpilot.pool.ops import Call, Reply

log = logging.getLogger(__name__)

Handler = Callable[..., Awaitable[Any]]
Handlers = dict[str, Handler]


async def answer(handlers: Handlers, call: Call) -> Reply:
    """The reply to ``call``: its handler's value, or an error (no such handler, or it raised)."""
    handler = handlers.get(call.name)
    if handler is None:
        return Reply(call.id, error=f"no handler for {call.name!r}")
    try:
        value = await handler(*call.args)
    except Exception as err:
        log.exception("answering %s", call.name)
        return Reply(call.id, error=f"{type(err).__name__}: {err}")
    return Reply(call.id, value)


class Pending:
    """The calls one side sent and awaits replies to."""

    def __init__(self) -> None:
        self._futures: dict[int, asyncio.Future[Any]] = {}
        self._ids = itertools.count(1)

    async def call(
        self, send: Callable[[Call], None], name: str, args: tuple[Any, ...], timeout: float
    ) -> Any:
        """Send a call and wait for its reply's value (TimeoutError; RuntimeError for an error)."""
        call_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._futures[call_id] = future
        send(Call(call_id, name, args))
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            self._futures.pop(call_id, None)

    def resolve(self, reply: Reply) -> None:
        future = self._futures.get(reply.id)
        if future is None or future.done():
            return  # the asker gave up (timed out) meanwhile
        if reply.error:
            future.set_exception(RuntimeError(reply.error))
        else:
            future.set_result(reply.value)

    def fail_all(self, error: str) -> None:
        for future in self._futures.values():
            if not future.done():
                future.set_exception(RuntimeError(error))
