"""``/debug/ui``: one HTML page for people, on the debug ports: who is connected and in sync, the
recent pushes and the slowest proxies.

Rendered on the server from the same state the JSON pages read (the connections, with
``sync_status.config_status`` for each type as ``istioctl proxy-status`` and ``/debug/syncz`` judge
it, and the push history), so the page cannot disagree with them. It is self-contained: inline CSS,
no script, nothing fetched from elsewhere. ``?refresh=N`` reloads it every N seconds. Every value that
comes from a client (proxy IDs, versions) or from config (names in triggers) is escaped.

Each number also sits in a ``data-`` attribute (``data-proxy``, ``data-type``, ``data-field``), so a
test or a script can read the page without parsing its text.
"""

from __future__ import annotations

import datetime
import html
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web
from envoy.service.status.v3 import csds_pb2

from meshpilot import __version__
from meshpilot.push.history import MAX_PUSHES as MAX_RECORDS
from meshpilot.push.history import PushHistory, PushRecord
from meshpilot.push.push_log import byte_count
from meshpilot.xds.connection import Connection
from meshpilot.xds.introspect import ConnectedProxies, sorted_connections
from meshpilot.xds.sync_status import config_status
from meshpilot.xds.types import TypeUrl

if TYPE_CHECKING:
    from meshpilot.model.push_context import PushContext
    from meshpilot.xds.server import DiscoveryServer

#: The columns ``istioctl proxy-status`` shows, in its order.
TYPES: tuple[tuple[str, str], ...] = (
    ("CDS", TypeUrl.CLUSTER.value),
    ("LDS", TypeUrl.LISTENER.value),
    ("EDS", TypeUrl.ENDPOINT.value),
    ("RDS", TypeUrl.ROUTE.value),
    ("ECDS", "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig"),
)
#: Rows of the proxy table at most (``?proxies=N`` asks for another bound).
MAX_PROXIES = 1000
PUSHES = 50
SLOWEST = 10

_STATUS_TEXT = {
    csds_pb2.SYNCED: "SYNCED",
    csds_pb2.STALE: "STALE",
    csds_pb2.NOT_SENT: "NOT SENT",
    csds_pb2.ERROR: "ERROR",
}

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.4em;margin:0 0 .2em}h2{font-size:1.1em;margin:1.6em 0 .4em}
.meta{color:#666}.summary span{display:inline-block;margin-right:1.5em}
.summary b{font-size:1.3em}
table{border-collapse:collapse;background:#fff;box-shadow:0 0 0 1px #ddd}
th,td{padding:.25em .6em;text-align:left;border-bottom:1px solid #eee;white-space:nowrap}
th{background:#f0f0f0;font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums}
.SYNCED{color:#18794e}.STALE{color:#b45309;font-weight:600}.ERROR{color:#b91c1c;font-weight:700}
.NOT-SENT,.IGNORED{color:#999}
.bar{height:.8em;background:#3b82f6;border-radius:2px;min-width:1px}
.bar.eds{background:#a855f7}.trigger{max-width:40em;overflow:hidden;text-overflow:ellipsis}
"""


#: Beside the escaping: the page runs no script and loads nothing, so a value that slipped through
#: could still do neither.
_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
}


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def type_status(conn: Connection, type_url: str) -> str:
    """One cell of ``istioctl proxy-status``: IGNORED when the proxy does not watch the type."""
    watch = conn.watched.get(type_url)
    if watch is None:
        return "IGNORED"
    return _STATUS_TEXT.get(config_status(watch), "IGNORED")


def _int(query: Mapping[str, str], key: str, default: int) -> int:
    try:
        return max(0, int(query.get(key, default)))
    except ValueError:
        return default


@dataclass(frozen=True, slots=True)
class ProxyRow:
    """One row of the proxy table, as plain data (a push worker sends it to the main process)."""

    proxy_id: str
    connection_id: str
    cluster: str
    type: str
    istio_version: str
    protocol: str
    #: One cell per ``TYPES`` entry.
    statuses: tuple[str, ...]
    #: The proxy's last push, for people ("-" when none is recorded).
    last_push: str
    connected_at: float


@dataclass(frozen=True, slots=True)
class PushShare:
    """What one process's streams got from one push."""

    proxies: int
    bytes: int
    duration_s: float


_NOTHING = PushShare(0, 0, 0.0)


@dataclass(frozen=True, slots=True)
class StreamView:
    """What the page shows of the streams one process holds (or of a whole pool, ``merge_views``)."""

    rows: tuple[ProxyRow, ...]
    #: (proxy ID, slowest recent push in seconds), slowest first, at most ``SLOWEST``.
    slowest: tuple[tuple[str, float], ...]
    #: By push number, as every process names a push (a push worker numbers the main process's
    #: pushes as the main process did, and its own apart: ``PushRecord.local``).
    shares: Mapping[int, PushShare]


def stream_view(proxies: ConnectedProxies, history: PushHistory, scope: str) -> StreamView:
    """The connections of this process (of ``scope``'s namespace when given) and their pushes."""
    rows = []
    for conn in sorted_connections(proxies, scope):
        proxy = conn.proxy
        last = history.for_proxy(proxy.id, 1)
        if last:
            record, pushed = last[0]
            last_text = f"#{record.label}: {byte_count(pushed.bytes)} in {_ms(pushed.duration_s)}"
        else:
            last_text = "-"
        rows.append(
            ProxyRow(
                proxy.id,
                conn.id,
                proxy.cluster_id,
                proxy.type.value,
                proxy.metadata.istio_version,
                conn.protocol,
                tuple(type_status(conn, url) for _, url in TYPES),
                last_text,
                conn.connected_at,
            )
        )
    in_scope = {row.proxy_id for row in rows}
    slowest = [(p, d) for p, d in history.slowest_proxies(SLOWEST * 10) if p in in_scope][:SLOWEST]
    # A push worker's own pushes have no row in the main process's table: only numbered ones count
    # (picked before the bound, so that a worker's own pushes never crowd out the table's rows).
    numbered = [r for r in history.recent(MAX_RECORDS) if not r.local][:PUSHES]
    shares = {r.number: PushShare(r.proxies, r.bytes, r.duration_s) for r in numbered}
    return StreamView(tuple(rows), tuple(slowest), shares)


def merge_views(views: Iterable[StreamView]) -> StreamView:
    """One view of several processes' streams: every row, the slowest of all, each push's shares
    added up (its duration is the longest of them: the processes push side by side)."""
    rows: list[ProxyRow] = []
    # By proxy: one that reconnected to another worker may be in two views for a while.
    slowest: dict[str, float] = {}
    shares: dict[int, PushShare] = {}
    for view in views:
        rows += view.rows
        for proxy_id, seconds in view.slowest:
            slowest[proxy_id] = max(seconds, slowest.get(proxy_id, 0.0))
        for key, share in view.shares.items():
            had = shares.get(key)
            shares[key] = (
                share
                if had is None
                else PushShare(
                    had.proxies + share.proxies,
                    had.bytes + share.bytes,
                    max(had.duration_s, share.duration_s),
                )
            )
    rows.sort(key=lambda row: (row.connection_id, row.proxy_id))
    ranked = sorted(slowest.items(), key=lambda item: (-item[1], item[0]))
    return StreamView(tuple(rows), tuple(ranked[:SLOWEST]), shares)


def render(
    view: StreamView, history: PushHistory, push: PushContext | None, query: Mapping[str, str], scope: str
) -> str:
    """The page: ``view``'s streams, and ``history``'s pushes with what ``view`` says they sent."""
    limit = _int(query, "proxies", MAX_PROXIES)
    refresh = _int(query, "refresh", 0)
    rows = view.rows
    synced = sum(1 for row in rows if all(s in ("SYNCED", "IGNORED") for s in row.statuses))
    records = history.recent(PUSHES)
    parts: list[str] = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        "<title>meshpilot</title>",
        f'<meta http-equiv="refresh" content="{refresh}">' if refresh else "",
        f"<style>{_CSS}</style></head><body>",
        "<h1>meshpilot</h1>",
        f"<div class=meta>version {_e(__version__)} · push version "
        f'<span data-field="push-version">{_e(push.version if push else "(not ready)")}</span>'
        f" · rendered {_e(_iso(time.time()))}</div>",
        '<div class="summary" id="summary">',
        f'<span>connected <b data-field="connected">{len(rows)}</b></span>',
        f'<span>in sync <b data-field="synced">{synced}</b></span>',
        f'<span>pushes recorded <b data-field="pushes">{history.pushes_started}</b></span>',
        "</div>",
    ]
    parts += _proxy_table(rows[:limit])
    if len(rows) > limit:
        parts.append(f"<p>{len(rows) - limit} more not shown (<code>?proxies=N</code>)</p>")
    parts += _push_timeline(records, view.shares, scoped=bool(scope))
    parts += _slowest(view.slowest)
    parts.append("</body></html>")
    return "".join(parts)


def _proxy_table(rows: Sequence[ProxyRow]) -> list[str]:
    head = "".join(f"<th>{name}</th>" for name, _ in TYPES)
    out = [
        "<h2>Connected proxies</h2>",
        '<table id="proxies"><thead><tr><th>Proxy</th><th>Cluster</th><th>Type</th><th>Istio</th>'
        f"<th>Protocol</th>{head}<th>Last push</th><th>Connected</th></tr></thead><tbody>",
    ]
    for row in rows:
        cells = "".join(
            f'<td class="{_e(s.replace(" ", "-"))}" data-type="{name}">{_e(s)}</td>'
            for (name, _), s in zip(TYPES, row.statuses, strict=True)
        )
        out.append(
            f'<tr class="proxy" data-proxy="{_e(row.proxy_id)}" data-connection="{_e(row.connection_id)}">'
            f"<td>{_e(row.proxy_id)}</td><td>{_e(row.cluster)}</td><td>{_e(row.type)}</td>"
            f"<td>{_e(row.istio_version)}</td><td>{_e(row.protocol)}</td>{cells}"
            f"<td>{_e(row.last_push)}</td><td>{_e(_iso(row.connected_at))}</td></tr>"
        )
    out.append("</tbody></table>")
    return out


def _trigger(record: PushRecord, scoped: bool) -> str:
    # A caller limited to a namespace does not see other namespaces' object names.
    return ", ".join(f"{r}:{n}" for r, n in sorted(record.reasons.items())) if scoped else record.trigger


def _push_timeline(records: list[PushRecord], shares: Mapping[int, PushShare], *, scoped: bool) -> list[str]:
    # What each push sent is the streams' to say (in a pool the main process records the push and
    # the workers send it).
    sent = [shares.get(r.number, _NOTHING) for r in records]
    longest = max((s.duration_s for s in sent), default=0.0) or 1.0
    out = [
        "<h2>Recent pushes</h2>",
        '<table id="pushes"><thead><tr><th>#</th><th>Started</th><th>Trigger</th><th>Reasons</th>'
        "<th>Merged</th><th>Kind</th><th>Proxies</th><th>Bytes</th><th>Duration</th><th></th></tr>"
        "</thead><tbody>",
    ]
    for record, share in zip(records, sent, strict=True):
        width = max(1.0, 200 * share.duration_s / longest)
        kind = "full" if record.full else "eds"
        reasons = ", ".join(f"{r}:{n}" for r, n in sorted(record.reasons.items()))
        out.append(
            f'<tr class="push" data-number="{record.number}">'
            f'<td class="num">{record.number}</td><td>{_e(_iso(record.started))}</td>'
            f'<td class="trigger" title="{_e(_trigger(record, scoped))}">{_e(_trigger(record, scoped))}</td>'
            f"<td>{_e(reasons)}</td>"
            f'<td class="num" data-field="merged">{record.merged}</td><td>{kind}</td>'
            f'<td class="num" data-field="proxies">{share.proxies}</td>'
            f'<td class="num" data-field="bytes" data-value="{share.bytes}">'
            f"{_e(byte_count(share.bytes))}</td>"
            f'<td class="num" data-field="duration" data-value="{share.duration_s:.6f}">'
            f"{_e(_ms(share.duration_s))}</td>"
            f'<td><div class="bar {kind}" style="width:{width:.0f}px"></div></td></tr>'
        )
    if not records:
        out.append('<tr><td colspan="10">no push yet</td></tr>')
    out.append("</tbody></table>")
    return out


def _slowest(rows: Sequence[tuple[str, float]]) -> list[str]:
    out = [
        "<h2>Slowest proxies</h2>",
        '<table id="slowest"><thead><tr><th>Proxy</th><th>Slowest recent push</th></tr></thead><tbody>',
    ]
    for proxy_id, duration in rows:
        out.append(
            f'<tr class="slow" data-proxy="{_e(proxy_id)}"><td>{_e(proxy_id)}</td>'
            f'<td class="num" data-value="{duration:.6f}">{_e(_ms(duration))}</td></tr>'
        )
    if not rows:
        out.append('<tr><td colspan="2">no push yet</td></tr>')
    out.append("</tbody></table>")
    return out


def response(text: str) -> web.Response:
    return web.Response(text=text, content_type="text/html", headers=_HEADERS)


def ui_page(server: DiscoveryServer) -> Callable[[Mapping[str, str], str], web.Response]:
    """The page of one process serving every stream, as the debug page set holds it
    (``server.debug.Page``; a push-worker pool gathers its workers' views: ``pool.debug_pages``)."""

    def page(query: Mapping[str, str], scope: str = "") -> web.Response:
        view = stream_view(server, server.history, scope)
        return response(render(view, server.history, server.push_context, query, scope))

    return page
