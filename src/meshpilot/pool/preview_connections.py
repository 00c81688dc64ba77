"""The connected proxies a change preview (``push.preview``) considers, in a push-worker pool.

The preview runs in the main process, which holds the model but no stream. Each worker sends its
connections as plain data: the proxy's identity without its state (the state holds the worker's
Sidecar scopes, which would drag its snapshot along) and what each stream watches. The main process
gives every proxy its state again from its own model, which is the same as the workers' (the change
log), so the preview decides and generates as the proxy's worker would.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from meshpilot.model.proxy import ProxyState
from meshpilot.pool.calls import Handlers
from meshpilot.pool.supervisor import PushWorkerPool
from meshpilot.push.environment import MeshEnvironment
from meshpilot.push.preview import watched_copy
from meshpilot.xds.connection import Connection
from meshpilot.xds.server import DiscoveryServer

if TYPE_CHECKING:
    from meshpilot.server.app import DiscoveryApp

HANDLER = "preview_connections"


def worker_handlers(app: DiscoveryApp) -> Handlers:
    async def connections(scope: str) -> list[Connection]:
        return [
            _portable(conn)
            for conn in app.server.connections.values()
            if not scope or conn.proxy.config_namespace == scope
        ]

    return {HANDLER: connections}


def _portable(conn: Connection) -> Connection:
    return Connection(
        proxy=dataclasses.replace(conn.proxy, state=ProxyState()),
        peer=conn.peer,
        identity=conn.identity,
        protocol=conn.protocol,
        id=conn.id,
        connected_at=conn.connected_at,
        watched=watched_copy(conn),
    )


def pool_connections(
    pool: PushWorkerPool, env: MeshEnvironment, server: DiscoveryServer
) -> Callable[[str], Awaitable[list[Connection]]]:
    """``PreviewSources.connections`` for the main process: every worker's, with their state."""

    async def gather(scope: str) -> list[Connection]:
        push = server.push_context
        found = [conn for answer in await pool.call_all(HANDLER, scope) for conn in answer]
        if push is not None:
            for conn in found:
                env.refresh_proxy(conn.proxy, push)
        return found

    return gather
