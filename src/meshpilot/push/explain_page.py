"""``/debug/explain``: the push explanation as a debug page (``push.explain``).

``?proxyID=ID`` (a part of the connection ID, as ``config_dump`` takes it) lists the proxy's last
pushes with their triggers, what was sent and why the proxy was in scope (for a gateway, also the
Gateways that select it); ``&resource=TYPE/NAME``
instead names the Istio objects behind one resource it holds; ``&limit=N`` bounds the pushes (10).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson
from aiohttp import web

from meshpilot.push.explain import ExplainError, pushes, resource
from meshpilot.xds.introspect import find_connection


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=orjson.dumps(data, option=orjson.OPT_INDENT_2), status=status, content_type="application/json"
    )


def explain_page(server: Any) -> Callable[[Mapping[str, str], str], web.Response]:
    """The page over ``server`` (an ``xds.server.DiscoveryServer``: its connections, snapshot, index
    and push history)."""

    def page(query: Mapping[str, str], scope: str = "") -> web.Response:
        proxy_id = query.get("proxyID", "")
        if not proxy_id:
            return web.Response(status=400, text="You must provide a proxyID in the query string\n")
        conn = find_connection(server, proxy_id, scope)
        push = server.push_context
        reference = query.get("resource", "")
        if reference:
            if conn is None or push is None:
                return web.Response(status=404, text="Proxy not connected to this Pilot instance.\n")
            try:
                return _json(resource(conn, push, server.index, reference))
            except ExplainError as err:
                return web.Response(status=400, text=f"{err}\n")
        try:
            limit = max(1, min(int(query.get("limit", "10")), 10))
        except ValueError:
            return web.Response(status=400, text="limit must be a number\n")
        # A proxy that left a moment ago is still in the history (by its proxy ID), not connected.
        known = conn.proxy.id if conn is not None else _history_id(server, proxy_id, scope)
        if known is None:
            return web.Response(status=404, text="No pushes known for this proxy.\n")
        return _json(pushes(server.history, conn, known, push, limit))

    return page


def _history_id(server: Any, proxy_id: str, scope: str) -> str | None:
    for known in server.history.proxy_ids():
        if proxy_id in known and (not scope or known.endswith(f".{scope}")):
            return str(known)
    return None
