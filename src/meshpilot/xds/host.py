"""What a stream may ask of the discovery server: the whole interface between the two.

A stream (either protocol) reads the current snapshot, the generators and
the cache through this, and registers itself to receive pushes. Nothing
else of the server is in reach, so the stream side can be served by another
process holding the same few things.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Protocol

from meshpilot.model.endpoint_index import EndpointIndex
from meshpilot.model.proxy import Proxy
from meshpilot.model.push_context import PushContext
from meshpilot.model.push_request import PushRequest
from meshpilot.push.history import PushHistory
from meshpilot.server.metrics import Metrics
from meshpilot.xds.cache import XdsCache
from meshpilot.xds.connection import Connection
from meshpilot.xds.generators.base import Generator
from meshpilot.xds.types import TypeUrl


class PushTarget(Protocol):
    """A stream, as the server's push workers see it."""

    def deliver(self, request: PushRequest, done: Callable[[], None]) -> None:
        """Handle ``request`` in turn; call ``done`` once handled or dropped."""


class StreamHost(Protocol):
    metrics: Metrics

    @property
    def cluster_id(self) -> str:
        """The cluster a proxy is in when its node metadata does not say."""

    @property
    def push_context(self) -> PushContext | None:
        """The current snapshot; None until the server is ready (streams are refused until then)."""

    @property
    def cache(self) -> XdsCache | None: ...

    @property
    def index(self) -> EndpointIndex: ...

    def refresh_proxy(self, proxy: Proxy, push: PushContext) -> None:
        """Recompute what the proxy sees (its scope, its services) in ``push``."""

    def generators_for(self, proxy: Proxy) -> Mapping[TypeUrl, Generator]: ...

    @property
    def history(self) -> PushHistory | None:
        """Where a stream records what each push sent its proxy; None records nothing."""

    @property
    def control_plane(self) -> str:
        """Who is serving, as sync status responses name it (``ControlPlane.identifier``: the JSON
        ``istioctl version`` reads)."""

    def trust_domains(self) -> Collection[str]:
        """The trust domains whose identities may ask for config (read per stream: the mesh may change)."""

    def add_connection(self, conn: Connection, stream: PushTarget) -> None: ...

    def remove_connection(self, conn: Connection) -> None: ...
