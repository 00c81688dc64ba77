"""JwksResolver: fetches the JWKS of RequestAuthentication ``jwksUri``s so they can be inlined.

istiod's JwksResolver (``model/jwks_resolver.go``) fetches synchronously while it builds config.
Here generation stays pure and never waits on the network: a lookup of an unknown source returns
nothing (the filter then inlines the fail-closed JWKS, as istiod does when a fetch fails) and
starts a fetch in the background; when it brings new keys, a full push is requested for the
RequestAuthentications that asked. Known keys are refreshed every ``refresh_s`` (istiod's
PILOT_JWT_PUB_KEY_REFRESH_INTERVAL, 20 minutes); after a failure, every ``retry_s``.

Failures (timeout, a status other than 200, a body that is not a JSON object with a non-empty
``keys`` list) are logged and counted against each RequestAuthentication that uses the source;
the last good keys stay. An issuer without a ``jwksUri`` is resolved through its OpenID
discovery document (``<issuer>/.well-known/openid-configuration``).

Bounded: at most ``max_sources`` sources are kept (the least recently used is dropped), at most
``max_concurrent`` fetches run at once, and a body may be at most ``max_bytes`` long.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from meshpilot.model.config import ConfigKey
from meshpilot.networking.policy_problems import PROBLEMS, PolicyProblems

log = logging.getLogger(__name__)

_DISCOVERY_SUFFIX = "/.well-known/openid-configuration"


class JwksError(Exception):
    """A source that gave no usable JWKS."""


def parse_jwks(body: bytes) -> str:
    """The JWKS text if ``body`` is a JSON object with a non-empty ``keys`` list."""
    try:
        text = body.decode()
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError) as err:
        raise JwksError(f"JWKS is not UTF-8 JSON: {err}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list) or not doc["keys"]:
        raise JwksError("JWKS has no keys")
    return text


@dataclass(slots=True)
class _Source:
    uri: str
    issuer: str
    timeout_s: float
    owners: set[ConfigKey] = field(default_factory=set)
    jwks: str | None = None
    #: Monotonic time of the next fetch; 0 while one is due or running.
    next_fetch: float = 0.0
    fetching: bool = False


@dataclass(frozen=True, slots=True)
class JwksOptions:
    refresh_s: float = 20 * 60.0
    retry_s: float = 60.0
    max_sources: int = 1000
    max_concurrent: int = 8
    max_bytes: int = 1 << 20


class JwksResolver:
    """The JwksLookup generators read, and the fetcher behind it (``run`` drives refreshes)."""

    def __init__(
        self,
        on_change: Callable[[frozenset[ConfigKey]], None],
        options: JwksOptions | None = None,
        problems: PolicyProblems = PROBLEMS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._on_change = on_change
        self.options = options or JwksOptions()
        self._problems = problems
        self._clock = clock
        self._sources: OrderedDict[tuple[str, str], _Source] = OrderedDict()
        self._wake = asyncio.Event()
        self._semaphore = asyncio.Semaphore(self.options.max_concurrent)
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    # -- JwksLookup ----------------------------------------------------------------------------

    def jwks(self, uri: str, issuer: str, timeout_s: float, owner: ConfigKey) -> str | None:
        key = (uri, "" if uri else issuer)
        source = self._sources.get(key)
        if source is None:
            source = _Source(uri, issuer, timeout_s)
            self._sources[key] = source
            while len(self._sources) > self.options.max_sources:
                self._sources.popitem(last=False)
            self._wake.set()
        else:
            self._sources.move_to_end(key)
        source.owners.add(owner)
        return source.jwks

    def known(self, uri: str, issuer: str) -> str | None:
        """The keys already held for this source, or None; unlike ``jwks`` it registers no source
        to fetch and no owner to push (a change preview must make the server do neither)."""
        source = self._sources.get((uri, "" if uri else issuer))
        return source.jwks if source is not None else None

    def held(self) -> dict[tuple[str, str], str]:
        """Every source's keys that are held, by (uri, issuer when there is no uri): what a push
        worker's lookup serves (``pool.jwks``)."""
        return {key: source.jwks for key, source in self._sources.items() if source.jwks is not None}

    # -- the fetcher ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Fetch due sources until ``shutdown``."""
        try:
            while not self._closed:
                now = self._clock()
                for source in list(self._sources.values()):
                    if not source.fetching and source.next_fetch <= now:
                        source.fetching = True
                        task = asyncio.create_task(self._fetch(source))
                        self._tasks.add(task)
                        task.add_done_callback(self._tasks.discard)
                due = [s.next_fetch for s in self._sources.values() if not s.fetching]
                wait = max(0.05, min(due) - now) if due else None
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)
        finally:
            await self.shutdown()

    async def shutdown(self) -> None:
        """Stop fetching; idempotent."""
        self._closed = True
        self._wake.set()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _fetch(self, source: _Source) -> None:
        try:
            async with self._semaphore:
                jwks = await self._resolve(source)
        except Exception as err:  # any failure waits for the retry: never a fetch loop
            message = str(err) or type(err).__name__
            for owner in sorted(source.owners, key=ConfigKey.sort_key):
                self._problems.record(
                    "RequestAuthentication",
                    f"{owner.namespace}/{owner.name}",
                    f"JWKS fetch for issuer {source.issuer!r} ({source.uri or 'OpenID discovery'}) failed: "
                    f"{message}; {'keeping the last good keys' if source.jwks else 'tokens are rejected'}",
                )
            source.next_fetch = self._clock() + self.options.retry_s
            return
        finally:
            source.fetching = False
            self._wake.set()
        source.next_fetch = self._clock() + self.options.refresh_s
        if jwks != source.jwks:
            source.jwks = jwks
            log.info("JWKS for issuer %s (%s) fetched", source.issuer, source.uri)
            self._on_change(frozenset(source.owners))

    async def _resolve(self, source: _Source) -> str:
        uri = source.uri
        if not uri:
            discovery = await self._get(source.issuer.rstrip("/") + _DISCOVERY_SUFFIX, source.timeout_s)
            try:
                uri = json.loads(discovery)["jwks_uri"]
            except (ValueError, KeyError, TypeError):
                raise JwksError("OpenID discovery document has no jwks_uri") from None
            if not isinstance(uri, str):
                raise JwksError("OpenID discovery document has no jwks_uri")
        return parse_jwks(await self._get(uri, source.timeout_s))

    async def _get(self, uri: str, timeout_s: float) -> bytes:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with self._session.get(uri, timeout=timeout) as response:
            if response.status != 200:
                raise JwksError(f"GET {uri}: status {response.status}")
            body = await response.content.read(self.options.max_bytes + 1)
            if len(body) > self.options.max_bytes:
                raise JwksError(f"GET {uri}: body longer than {self.options.max_bytes} bytes")
            return body
