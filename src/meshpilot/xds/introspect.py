"""What the debug views (HTTP ``/debug/*`` and the ``istio.io/debug`` xDS types) read of the server.

Both views see the server only through ``ConnectedProxies``: its connections and how it generates
configuration for one of them. The rules the two views share live here and in ``sync_status`` and
``config_dump``, so a page and its xDS twin cannot disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from meshpilot.model.endpoint_index import EndpointIndex
from meshpilot.model.proxy import Proxy
from meshpilot.model.push_context import PushContext
from meshpilot.xds.connection import Connection
from meshpilot.xds.generators.base import Generator
from meshpilot.xds.types import TypeUrl


class ConnectedProxies(Protocol):
    """The server as the debug views see it (``DiscoveryServer`` is one)."""

    @property
    def connections(self) -> Mapping[str, Connection]:
        """Open streams by connection ID."""

    @property
    def push_context(self) -> PushContext | None: ...

    @property
    def index(self) -> EndpointIndex: ...

    def generators_for(self, proxy: Proxy) -> Mapping[TypeUrl, Generator]: ...


def sorted_connections(proxies: ConnectedProxies, namespace: str = "") -> list[Connection]:
    """The connections, by ID; only proxies of ``namespace`` when one is given."""
    conns = sorted(proxies.connections.values(), key=lambda c: c.id)
    return [c for c in conns if not namespace or c.proxy.config_namespace == namespace]


def find_connection(proxies: ConnectedProxies, proxy_id: str, namespace: str = "") -> Connection | None:
    """The first connection (by ID) whose ID contains ``proxy_id`` (istiod matches a part of the ID:
    ``pod.namespace`` finds ``pod.namespace-7``), within ``namespace`` when one is given."""
    if not proxy_id:
        return None
    return next((c for c in sorted_connections(proxies, namespace) if proxy_id in c.id), None)
