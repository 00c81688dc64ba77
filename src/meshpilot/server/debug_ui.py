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
from collections.abc import Callable, Mapping

from aiohttp import web
from envoy.service.status.v3 import csds_pb2

from meshpilot import __version__
from meshpilot.push.history import PushHistory, PushRecord
from meshpilot.push.push_log import byte_count
from meshpilot.xds.connection import Connection
from meshpilot.xds.introspect import ConnectedProxies, sorted_connections
from meshpilot.xds.sync_status import config_status
from meshpilot.xds.types import TypeUrl

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


def render(proxies: ConnectedProxies, history: PushHistory, query: Mapping[str, str], scope: str) -> str:
    conns = sorted_connections(proxies, scope)
    push = proxies.push_context
    limit = _int(query, "proxies", MAX_PROXIES)
    refresh = _int(query, "refresh", 0)
    statuses = [(conn, [type_status(conn, url) for _, url in TYPES]) for conn in conns]
    synced = sum(1 for _, row in statuses if all(s in ("SYNCED", "IGNORED") for s in row))
    in_scope = {c.proxy.id for c in conns}
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
        f'<span>connected <b data-field="connected">{len(conns)}</b></span>',
        f'<span>in sync <b data-field="synced">{synced}</b></span>',
        f'<span>pushes recorded <b data-field="pushes">{history.pushes_started}</b></span>',
        "</div>",
    ]
    parts += _proxy_table(statuses[:limit], history)
    if len(statuses) > limit:
        parts.append(f"<p>{len(statuses) - limit} more not shown (<code>?proxies=N</code>)</p>")
    parts += _push_timeline(records, scoped=bool(scope))
    parts += _slowest(history, in_scope)
    parts.append("</body></html>")
    return "".join(parts)


def _proxy_table(statuses: list[tuple[Connection, list[str]]], history: PushHistory) -> list[str]:
    head = "".join(f"<th>{name}</th>" for name, _ in TYPES)
    out = [
        "<h2>Connected proxies</h2>",
        '<table id="proxies"><thead><tr><th>Proxy</th><th>Cluster</th><th>Type</th><th>Istio</th>'
        f"<th>Protocol</th>{head}<th>Last push</th><th>Connected</th></tr></thead><tbody>",
    ]
    for conn, row in statuses:
        proxy = conn.proxy
        cells = "".join(
            f'<td class="{_e(s.replace(" ", "-"))}" data-type="{name}">{_e(s)}</td>'
            for (name, _), s in zip(TYPES, row, strict=True)
        )
        last = history.for_proxy(proxy.id, 1)
        if last:
            record, pushed = last[0]
            last_text = f"#{record.number}: {byte_count(pushed.bytes)} in {_ms(pushed.duration_s)}"
        else:
            last_text = "-"
        out.append(
            f'<tr class="proxy" data-proxy="{_e(proxy.id)}" data-connection="{_e(conn.id)}">'
            f"<td>{_e(proxy.id)}</td><td>{_e(proxy.cluster_id)}</td><td>{_e(proxy.type.value)}</td>"
            f"<td>{_e(proxy.metadata.istio_version)}</td><td>{_e(conn.protocol)}</td>{cells}"
            f"<td>{_e(last_text)}</td><td>{_e(_iso(conn.connected_at))}</td></tr>"
        )
    out.append("</tbody></table>")
    return out


def _trigger(record: PushRecord, scoped: bool) -> str:
    # A caller limited to a namespace does not see other namespaces' object names.
    return ", ".join(f"{r}:{n}" for r, n in sorted(record.reasons.items())) if scoped else record.trigger


def _push_timeline(records: list[PushRecord], *, scoped: bool) -> list[str]:
    longest = max((r.duration_s for r in records), default=0.0) or 1.0
    out = [
        "<h2>Recent pushes</h2>",
        '<table id="pushes"><thead><tr><th>#</th><th>Started</th><th>Trigger</th><th>Reasons</th>'
        "<th>Merged</th><th>Kind</th><th>Proxies</th><th>Bytes</th><th>Duration</th><th></th></tr>"
        "</thead><tbody>",
    ]
    for record in records:
        width = max(1.0, 200 * record.duration_s / longest)
        kind = "full" if record.full else "eds"
        reasons = ", ".join(f"{r}:{n}" for r, n in sorted(record.reasons.items()))
        out.append(
            f'<tr class="push" data-number="{record.number}">'
            f'<td class="num">{record.number}</td><td>{_e(_iso(record.started))}</td>'
            f'<td class="trigger" title="{_e(_trigger(record, scoped))}">{_e(_trigger(record, scoped))}</td>'
            f"<td>{_e(reasons)}</td>"
            f'<td class="num" data-field="merged">{record.merged}</td><td>{kind}</td>'
            f'<td class="num" data-field="proxies">{record.proxies}</td>'
            f'<td class="num" data-field="bytes" data-value="{record.bytes}">'
            f"{_e(byte_count(record.bytes))}</td>"
            f'<td class="num" data-field="duration" data-value="{record.duration_s:.6f}">'
            f"{_e(_ms(record.duration_s))}</td>"
            f'<td><div class="bar {kind}" style="width:{width:.0f}px"></div></td></tr>'
        )
    if not records:
        out.append('<tr><td colspan="10">no push yet</td></tr>')
    out.append("</tbody></table>")
    return out


def _slowest(history: PushHistory, in_scope: set[str]) -> list[str]:
    out = [
        "<h2>Slowest proxies</h2>",
        '<table id="slowest"><thead><tr><th>Proxy</th><th>Slowest recent push</th></tr></thead><tbody>',
    ]
    rows = [(p, d) for p, d in history.slowest_proxies(SLOWEST * 10) if p in in_scope][:SLOWEST]
    for proxy_id, duration in rows:
        out.append(
            f'<tr class="slow" data-proxy="{_e(proxy_id)}"><td>{_e(proxy_id)}</td>'
            f'<td class="num" data-value="{duration:.6f}">{_e(_ms(duration))}</td></tr>'
        )
    if not rows:
        out.append('<tr><td colspan="2">no push yet</td></tr>')
    out.append("</tbody></table>")
    return out


def ui_page(
    proxies: ConnectedProxies, history: PushHistory
) -> Callable[[Mapping[str, str], str], web.Response]:
    """The page as the debug page set holds it (``server.debug.Page``)."""

    def page(query: Mapping[str, str], scope: str = "") -> web.Response:
        return web.Response(
            text=render(proxies, history, query, scope), content_type="text/html", headers=_HEADERS
        )

    return page
