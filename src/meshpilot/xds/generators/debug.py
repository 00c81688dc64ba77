"""The debug types istioctl asks for over ADS (istiod's StatusGen and DebugGen).

- ``istio.io/debug/syncz``: one CSDS ClientConfig per connected proxy (``istioctl proxy-status``,
  ``istioctl version``).
- ``istio.io/debug/config_dump``: the config dump of the one proxy named (``istioctl proxy-status
  <pod>``), one unnamed resource per section.
- ``istio.io/debug``: a debug page by name (``syncz``, ``config_dump?proxyID=...``, ``connections``,
  ``list``, ...), its JSON body as the value of an Any typed ``istio.io/debug``
  (``istioctl x internal-debug``).

They answer one request and keep nothing: the stream keeps no watch for them and pushes never
regenerate them (``TypeUrl.is_debug``). Who may ask is ``DebugAccess``'s rule, applied to the
identity the stream proved; a refusal ends the stream with its status, as in istiod.

In a push worker the answer covers the whole pool, not only the streams of the worker istioctl
happened to reach: the generators ask a ``Fleet`` (``pool.debug_pages``) instead of reading the
local connections, through ``answer_debug``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol, runtime_checkable
from urllib.parse import parse_qsl, urlsplit

import grpc

from meshpilot.model.push_context import PushContext
from meshpilot.model.push_request import PushRequest
from meshpilot.networking import wire
from meshpilot.networking.protobuf import pack
from meshpilot.xds.config_dump import config_dump
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.debug_access import DebugAccess, DebugRefused
from meshpilot.xds.generators.base import GenerationContext, Generator, Resource
from meshpilot.xds.introspect import ConnectedProxies, find_connection, sorted_connections
from meshpilot.xds.sync_status import client_config, is_proxy
from meshpilot.xds.types import TypeUrl

log = logging.getLogger(__name__)


class DebugPages(Protocol):
    """The debug pages by name (the HTTP ``/debug/`` pages, ``server.debug.DebugHandlers``)."""

    def render(self, page: str, query: Mapping[str, str], scope: str) -> tuple[int, bytes]:
        """The status and body of ``/debug/<page>?<query>``, limited to namespace ``scope`` if set."""


class Fleet(Protocol):
    """The proxies of every process serving alongside this one (the push workers of a pool)."""

    async def client_configs(self, scope: str) -> list[tuple[str, bytes]]:
        """Every process's sync status: (proxy ID, packed ClientConfig), as ``sync_resources``."""

    async def config_dump(self, proxy_id: str, scope: str) -> list[bytes] | None:
        """The dump's sections from the process holding the proxy; None if none does."""

    async def render(self, page: str, query: Mapping[str, str], scope: str) -> tuple[int, bytes]:
        """``/debug/<page>`` as the pool's main process serves it (``DebugPages.render``)."""


@runtime_checkable
class DebugAnswer(Protocol):
    """A debug type whose answer may have to be gathered from other processes."""

    async def answer(self, ctx: GenerationContext, watch: WatchedResource) -> list[Resource]: ...


async def answer_debug(
    generator: Generator, ctx: GenerationContext, watch: WatchedResource
) -> list[Resource]:
    """The answer to one debug request (``DebugRefused`` when the caller may not have it)."""
    if isinstance(generator, DebugAnswer):
        return await generator.answer(ctx, watch)
    return generator.generate(ctx, watch, None) or []


def sync_resources(proxies: ConnectedProxies, scope: str) -> list[Resource]:
    """One packed ClientConfig per connected proxy of ``scope`` ("" for all), by connection ID."""
    return [
        Resource(c.proxy.id, pack(client_config(c)).SerializeToString())
        for c in sorted_connections(proxies, scope)
        if is_proxy(c)
    ]


def dump_sections(
    proxies: ConnectedProxies, push: PushContext, proxy_id: str, scope: str
) -> tuple[str, list[bytes]] | None:
    """The config dump of the first connection matching ``proxy_id`` (``find_connection``): its
    connection ID and serialized sections; None when no connection matches."""
    conn = find_connection(proxies, proxy_id, scope)
    if conn is None:
        return None
    return conn.id, [section.SerializeToString() for section in config_dump(proxies, conn, push).configs]


class _OneShot:
    """Never pushed: a debug answer is for the request that asked."""

    def needs_push(self, request: PushRequest) -> bool:
        return False


class SynczGenerator(_OneShot):
    type_url = TypeUrl.DEBUG_SYNCZ

    def __init__(self, proxies: ConnectedProxies, access: DebugAccess, fleet: Fleet | None = None) -> None:
        self.proxies = proxies
        self.access = access
        self.fleet = fleet

    def generate(
        self, ctx: GenerationContext, watch: WatchedResource, names: frozenset[str] | None
    ) -> list[Resource]:
        return sync_resources(
            self.proxies, self.access.status_scope(ctx.identity, ctx.push.mesh.root_namespace)
        )

    async def answer(self, ctx: GenerationContext, watch: WatchedResource) -> list[Resource]:
        if self.fleet is None:
            return self.generate(ctx, watch, None)
        scope = self.access.status_scope(ctx.identity, ctx.push.mesh.root_namespace)
        return [Resource(name, payload) for name, payload in await self.fleet.client_configs(scope)]


class ConfigDumpGenerator(_OneShot):
    type_url = TypeUrl.DEBUG_CONFIG_DUMP

    def __init__(self, proxies: ConnectedProxies, access: DebugAccess, fleet: Fleet | None = None) -> None:
        self.proxies = proxies
        self.access = access
        self.fleet = fleet

    def _asked(self, ctx: GenerationContext, watch: WatchedResource) -> tuple[str, str] | None:
        """The proxy ID asked for and the caller's scope; None for a malformed request."""
        scope = self.access.status_scope(ctx.identity, ctx.push.mesh.root_namespace)
        if len(watch.names) != 1:
            # istiod answers a malformed request with nothing rather than ending the stream.
            log.info("%s asked with %d names", self.type_url, len(watch.names))
            return None
        [proxy_id] = watch.names
        return proxy_id, scope

    def generate(
        self, ctx: GenerationContext, watch: WatchedResource, names: frozenset[str] | None
    ) -> list[Resource]:
        asked = self._asked(ctx, watch)
        if asked is None:
            return []
        found = dump_sections(self.proxies, ctx.push, *asked)
        return self._sections(asked[0], found[1] if found is not None else None)

    async def answer(self, ctx: GenerationContext, watch: WatchedResource) -> list[Resource]:
        if self.fleet is None:
            return self.generate(ctx, watch, None)
        asked = self._asked(ctx, watch)
        if asked is None:
            return []
        return self._sections(asked[0], await self.fleet.config_dump(*asked))

    def _sections(self, proxy_id: str, sections: list[bytes] | None) -> list[Resource]:
        if sections is None:
            # Like a 404, but empty: another replica may hold the proxy, and istioctl asks each.
            log.info("%s: no connection for %r", self.type_url, proxy_id)
            return []
        return [Resource("", section) for section in sections]


class DebugPageGenerator(_OneShot):
    type_url = TypeUrl.DEBUG

    def __init__(self, pages: DebugPages, access: DebugAccess, fleet: Fleet | None = None) -> None:
        self.pages = pages
        self.access = access
        self.fleet = fleet

    def _asked(self, ctx: GenerationContext, watch: WatchedResource) -> tuple[str, str, dict[str, str], str]:
        """The resource name, the page, its query and the caller's scope."""
        if len(watch.names) != 1:
            raise DebugRefused(grpc.StatusCode.INVALID_ARGUMENT, "exactly one debug request is required")
        [name] = watch.names
        url = urlsplit(name)
        scope = self.access.page_scope(ctx.identity, url.path, ctx.push.mesh.root_namespace)
        query = dict(parse_qsl(url.query, keep_blank_values=True))
        # Reading, not acting: ``adsz?push=true`` pushes only from loopback HTTP (server.debug_access).
        query.pop("push", None)
        return name, url.path, query, scope

    def generate(
        self, ctx: GenerationContext, watch: WatchedResource, names: frozenset[str] | None
    ) -> list[Resource]:
        name, page, query, scope = self._asked(ctx, watch)
        _, body = self.pages.render(page, query, scope)
        return [Resource(name, wire.any_bytes(TypeUrl.DEBUG.value, body))]

    async def answer(self, ctx: GenerationContext, watch: WatchedResource) -> list[Resource]:
        if self.fleet is None:
            return self.generate(ctx, watch, None)
        name, page, query, scope = self._asked(ctx, watch)
        _, body = await self.fleet.render(page, query, scope)
        return [Resource(name, wire.any_bytes(TypeUrl.DEBUG.value, body))]


def debug_generators(
    proxies: ConnectedProxies, pages: DebugPages, access: DebugAccess, fleet: Fleet | None = None
) -> dict[TypeUrl, Generator]:
    """The debug types; with ``fleet``, answered for every process of the pool."""
    return {
        TypeUrl.DEBUG_SYNCZ: SynczGenerator(proxies, access, fleet),
        TypeUrl.DEBUG_CONFIG_DUMP: ConfigDumpGenerator(proxies, access, fleet),
        TypeUrl.DEBUG: DebugPageGenerator(pages, access, fleet),
    }
