"""``/debug/ui`` served in-process: what a client sends is escaped, and the page's bounds hold."""

from __future__ import annotations

import asyncio
from pathlib import Path

from support.ads_client import AdsClient
from support.kube import workload, write
from support.processes import http_get
from support.xds_server import running, settings_for

from meshpilot.model.push_request import PushRequest

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
HOSTILE = "sidecar~127.0.0.11~<img src=x onerror=alert(1)>.default~default.svc.cluster.local"


async def test_client_text_is_escaped_and_rows_are_bounded(tmp_path: Path) -> None:
    config = tmp_path / "config"
    write(
        config / "apps.yaml", workload("reviews", "default", "10.96.0.20", 9080, {"reviews-v1": "127.0.0.21"})
    )
    settings = settings_for(config)
    async with running(settings) as app:
        clients = []
        for node in (HOSTILE, "sidecar~127.0.0.21~reviews-v1.default~default.svc.cluster.local"):
            client = AdsClient(str(settings.grpc_addr))
            client.send(CDS, node_id=node, node_metadata={"ISTIO_VERSION": "1.28.0"})
            client.ack(await client.recv())
            clients.append(client)
        try:
            status, body, headers = await asyncio.to_thread(
                http_get, "127.0.0.1", settings.http_addr.port, "/debug/ui?proxies=1&refresh=5"
            )
            page = body.decode()
            assert status == 200 and headers["content-type"].startswith("text/html")
            assert "<img" not in page and "&lt;img src=x onerror=alert(1)&gt;.default" in page
            assert page.count('<tr class="proxy"') == 1 and "1 more not shown" in page
            assert '<meta http-equiv="refresh" content="5">' in page
            assert "http://" not in page and "https://" not in page, "nothing fetched from elsewhere"
            assert '<b data-field="connected">2</b>' in page
            assert "script-src" not in headers["content-security-policy"]
            assert "default-src 'none'" in headers["content-security-policy"]
            assert app.debug.render("ui", {}, "")[0] == 200
        finally:
            for client in clients:
                await client.close()


def test_a_worker_s_own_pushes_are_not_shares_of_the_main_s() -> None:
    """A worker's view carries what its streams got from the main process's pushes only; its own
    pushes (7+1, ...) are left out before the table's bound, so they never crowd out numbered ones."""
    from types import SimpleNamespace

    from meshpilot.push.history import MAX_PUSHES, ProxyPush, PushHistory, TypeSent
    from meshpilot.server.debug_ui import PUSHES, stream_view

    history = PushHistory()
    token = 0

    def push(number: int | None, size: int) -> None:
        nonlocal token
        token += 1
        request = PushRequest(full=False)
        request.push = SimpleNamespace(version="v1")  # type: ignore[assignment]
        request.token = token
        history.started(request, number=number, local=number is None)
        history.proxy_pushed(token, ProxyPush("p", (TypeSent("sds", frozenset({"x"}), size),), size, 0.01))

    push(7, 100)
    for _ in range(MAX_PUSHES - 2):
        push(None, 1)
    push(8, 200)
    view = stream_view(SimpleNamespace(connections={}, push_context=None), history, "")  # type: ignore[arg-type]
    assert PUSHES < MAX_PUSHES - 2
    assert sorted(view.shares) == [7, 8]
    assert view.shares[8].bytes == 200 and view.shares[7].bytes == 100


def test_views_of_several_processes_make_one() -> None:
    """A push-worker pool's page: every worker's rows, each push's shares added up (its duration the
    longest, the workers pushing side by side), the slowest proxies of all."""
    from meshpilot.server.debug_ui import ProxyRow, PushShare, StreamView, merge_views

    def row(proxy: str, conn: str) -> ProxyRow:
        return ProxyRow(proxy, conn, "Kubernetes", "sidecar", "1.28.0", "delta", ("SYNCED",) * 5, "-", 0.0)

    one = StreamView(
        (row("b.default", "b.default-1"),),
        (("b.default", 0.2), ("a.default", 0.05)),
        {1: PushShare(1, 100, 0.2), 2: PushShare(1, 10, 0.01)},
    )
    two = StreamView(
        # a.default reconnected here from the other worker, whose stream is not closed yet.
        (row("a.default", "a.default-1"), row("c.default", "c.default-3")),
        (("c.default", 0.3), ("a.default", 0.1)),
        # A push only this worker recorded (it started after the other's last push).
        {1: PushShare(2, 250, 0.1), 3: PushShare(2, 20, 0.05)},
    )
    merged = merge_views([one, two])
    assert [r.proxy_id for r in merged.rows] == ["a.default", "b.default", "c.default"]
    assert merged.slowest == (("c.default", 0.3), ("b.default", 0.2), ("a.default", 0.1))
    assert merged.shares == {1: PushShare(3, 350, 0.2), 2: PushShare(1, 10, 0.01), 3: PushShare(2, 20, 0.05)}
    assert merge_views([]) == StreamView((), (), {})
