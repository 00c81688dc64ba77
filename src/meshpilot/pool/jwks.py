"""JWKS in a push-worker pool: fetched once, by the main process, for every worker.

A worker's generators look keys up here. A source not held yet is asked of the main process (with
the RequestAuthentication that needs it, so that its keys push it), whose ``JwksResolver`` fetches
it; every time the keys it holds change, the main process records them all in the change log
(``JwksKeys``) before the push they cause. So every worker serves the same keys under the same
version, and a worker that starts again has them in its snapshot: a proxy that moves between
workers never falls back to the deny-all key set meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from meshpilot.model.config import ConfigKey
from meshpilot.pool.calls import Handlers
from meshpilot.push.jwks_resolver import JwksResolver

log = logging.getLogger(__name__)

WANT = "jwks_want"


class ReplicaJwks:
    """A worker's ``JwksLookup``: the main process's keys."""

    def __init__(self, ask: Callable[..., Awaitable[Any]]) -> None:
        self._ask = ask
        self._keys: dict[tuple[str, str], str] = {}
        self._asked: set[tuple[str, str, ConfigKey]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def update(self, keys: dict[tuple[str, str], str]) -> None:
        self._keys = dict(keys)

    def jwks(self, uri: str, issuer: str, timeout_s: float, owner: ConfigKey) -> str | None:
        key = (uri, "" if uri else issuer)
        if (*key, owner) not in self._asked:
            # Once per source and owner: the main process keeps fetching it and pushes the owner.
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # generated outside the server's loop (a test): nobody to ask
                return self._keys.get(key)
            self._asked.add((*key, owner))
            task = loop.create_task(self._want(uri, issuer, timeout_s, owner))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return self._keys.get(key)

    async def _want(self, uri: str, issuer: str, timeout_s: float, owner: ConfigKey) -> None:
        try:
            await self._ask(WANT, uri, issuer, timeout_s, owner)
        except (TimeoutError, RuntimeError) as err:
            # Asked again by the next generation that needs it.
            self._asked.discard((uri, "" if uri else issuer, owner))
            log.warning("could not ask the main process for the JWKS of %s: %s", uri or issuer, err)


def main_handlers(resolver: JwksResolver) -> Handlers:
    """What the workers ask the main process: to fetch (and follow) a source for an owner."""

    async def want(uri: str, issuer: str, timeout_s: float, owner: ConfigKey) -> None:
        resolver.jwks(uri, issuer, timeout_s, owner)

    return {WANT: want}
