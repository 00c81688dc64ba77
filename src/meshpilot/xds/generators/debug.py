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
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol
from urllib.parse import parse_qsl, urlsplit

import grpc

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


class _OneShot:
    """Never pushed: a debug answer is for the request that asked."""

    def needs_push(self, request: PushRequest) -> bool:
        return False


class SynczGenerator(_OneShot):
    type_url = TypeUrl.DEBUG_SYNCZ

    def __init__(self, proxies: ConnectedProxies, access: DebugAccess) -> None:
        self.proxies = proxies
        self.access = access

    def generate(
        self, ctx: GenerationContext, watch: WatchedResource, names: frozenset[str] | None
    ) -> list[Resource]:
        scope = self.access.status_scope(ctx.identity, ctx.push.mesh.root_namespace)
        return [
            Resource(c.proxy.id, pack(client_config(c)).SerializeToString())
            for c in sorted_connections(self.proxies, scope)
            if is_proxy(c)
        ]


class ConfigDumpGenerator(_OneShot):
    type_url = TypeUrl.DEBUG_CONFIG_DUMP

    def __init__(self, proxies: ConnectedProxies, access: DebugAccess) -> None:
        self.proxies = proxies
        self.access = access

    def generate(
        self, ctx: GenerationContext, watch: WatchedResource, names: frozenset[str] | None
    ) -> list[Resource]:
        scope = self.access.status_scope(ctx.identity, ctx.push.mesh.root_namespace)
        if len(watch.names) != 1:
            # istiod answers a malformed request with nothing rather than ending the stream.
            log.info("%s asked with %d names", self.type_url, len(watch.names))
            return []
        [proxy_id] = watch.names
        conn = find_connection(self.proxies, proxy_id, scope)
        if conn is None:
            # Like a 404, but empty: another replica may hold the proxy, and istioctl asks each.
            log.info("%s: no connection for %r", self.type_url, proxy_id)
            return []
        dump = config_dump(self.proxies, conn, ctx.push)
        return [Resource("", section.SerializeToString()) for section in dump.configs]


class DebugPageGenerator(_OneShot):
    type_url = TypeUrl.DEBUG

    def __init__(self, pages: DebugPages, access: DebugAccess) -> None:
        self.pages = pages
        self.access = access

    def generate(
        self, ctx: GenerationContext, watch: WatchedResource, names: frozenset[str] | None
    ) -> list[Resource]:
        if len(watch.names) != 1:
            raise DebugRefused(grpc.StatusCode.INVALID_ARGUMENT, "exactly one debug request is required")
        [name] = watch.names
        url = urlsplit(name)
        scope = self.access.page_scope(ctx.identity, url.path, ctx.push.mesh.root_namespace)
        query = dict(parse_qsl(url.query, keep_blank_values=True))
        # Reading, not acting: ``adsz?push=true`` pushes only from loopback HTTP (server.debug_access).
        query.pop("push", None)
        _, body = self.pages.render(url.path, query, scope)
        return [Resource(name, wire.any_bytes(TypeUrl.DEBUG.value, body))]


def debug_generators(
    proxies: ConnectedProxies, pages: DebugPages, access: DebugAccess
) -> dict[TypeUrl, Generator]:
    return {
        TypeUrl.DEBUG_SYNCZ: SynczGenerator(proxies, access),
        TypeUrl.DEBUG_CONFIG_DUMP: ConfigDumpGenerator(proxies, access),
        TypeUrl.DEBUG: DebugPageGenerator(pages, access),
    }
