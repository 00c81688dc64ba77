"""The debug views of a push-worker pool: every proxy, whatever worker holds its stream.

The main process serves the HTTP and monitoring ports but holds no stream; each worker holds some.
So the pages that read the connections are gathered: the main process asks every worker for its own
page (``worker_handlers``) and makes one answer of them, as a single process would have written it
(``PoolPages``). The pages that read the model (``configz``, ``registryz``, ...) are the main
process's own: every worker holds the same model. ``/debug/ui`` shows the pushes the main process
recorded, with what the workers' streams got from each (a worker's record of a push carries the
main's number).

istioctl reaches one worker over xDS. That worker's debug types (``xds.generators.debug``) ask the
main process, which gathers the pool's answer the same way (``PoolPages.handlers``), so the
``istio.io/debug`` pages and ``/debug/...`` on HTTP are one code path and cannot disagree.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from meshpilot.pool.calls import Handlers
from meshpilot.pool.supervisor import PushWorkerPool
from meshpilot.server import debug_ui
from meshpilot.server.debug import AsyncPage, DebugHandlers, page_route
from meshpilot.xds.generators.base import Generator
from meshpilot.xds.generators.debug import debug_generators, dump_sections, sync_resources
from meshpilot.xds.types import TypeUrl

if TYPE_CHECKING:
    from meshpilot.server.app import DiscoveryApp

#: A worker's answer to a page: its status and body.
Answer = tuple[int, bytes]
Ask = Callable[..., Awaitable[Any]]


def worker_handlers(app: DiscoveryApp) -> Handlers:
    """What the main process asks a worker: its own part of each gathered answer."""
    server = app.server

    async def page(name: str, query: dict[str, str], scope: str) -> Answer:
        return app.debug.render(name, query, scope)

    async def client_configs(scope: str) -> list[tuple[str, bytes]]:
        return [(r.name, r.payload) for r in sync_resources(server, scope)]

    async def config_dump(proxy_id: str, scope: str) -> tuple[str, list[bytes]] | None:
        push = server.push_context
        return dump_sections(server, push, proxy_id, scope) if push is not None else None

    async def ui_view(scope: str) -> debug_ui.StreamView:
        return debug_ui.stream_view(server, server.history, scope)

    return {
        "page": page,
        "client_configs": client_configs,
        "config_dump": config_dump,
        "ui_view": ui_view,
    }


class WorkerFleet:
    """A worker's view of the pool (``xds.generators.debug.Fleet``): the main process's answers."""

    def __init__(self, ask: Ask) -> None:
        self._ask = ask

    async def client_configs(self, scope: str) -> list[tuple[str, bytes]]:
        answer: list[tuple[str, bytes]] = await self._ask("client_configs", scope)
        return answer

    async def config_dump(self, proxy_id: str, scope: str) -> list[bytes] | None:
        answer: list[bytes] | None = await self._ask("config_dump", proxy_id, scope)
        return answer

    async def render(self, page: str, query: Mapping[str, str], scope: str) -> Answer:
        answer: Answer = await self._ask("page", page, dict(query), scope)
        return answer


def worker_debug_generators(app: DiscoveryApp, ask: Ask) -> dict[TypeUrl, Generator]:
    """A worker's debug types, answering for the whole pool through the main process."""
    return debug_generators(app.server, app.debug, app.debug_rule, WorkerFleet(ask))


# -- the main process -----------------------------------------------------------------------------


def _json(data: Any) -> web.Response:
    return web.Response(body=orjson.dumps(data, option=orjson.OPT_INDENT_2), content_type="application/json")


def _body(response: web.Response) -> bytes:
    return response.body if isinstance(response.body, bytes) else b""


def _proxies(mine: web.Response, answers: list[Answer]) -> web.Response:
    """Pages listing proxies (``syncz``): every process's list, in one, by proxy."""
    rows = [row for _, body in answers for row in orjson.loads(body)]
    rows += orjson.loads(_body(mine))
    return _json(sorted(rows, key=lambda row: str(row.get("proxy", ""))))


def _clients(mine: web.Response, answers: list[Answer]) -> web.Response:
    """Pages counting and listing connections (``adsz``, ``connections``)."""
    pages = [orjson.loads(_body(mine)), *(orjson.loads(body) for _, body in answers)]
    clients = sorted(
        (c for page in pages for c in page.get("clients") or ()), key=lambda c: c["connectionId"]
    )
    out: dict[str, Any] = {"totalClients": sum(page["totalClients"] for page in pages)}
    # As each page writes it: adsz always lists its clients, connections only when there are some.
    if clients or any("clients" in page for page in pages):
        out["clients"] = clients
    return _json(out)


#: The pages that read the connections, and how the workers' answers make one.
_GATHERED: dict[str, Callable[[web.Response, list[Answer]], web.Response]] = {
    "syncz": _proxies,
    "adsz": _clients,
    "connections": _clients,
}
#: The pages about one proxy: answered by the worker holding it (else as the main process answers:
#: a missing proxyID, or a proxy nobody holds).
_ONE_PROXY = frozenset({"config_dump", "explain"})


class PoolPages:
    """The main process's debug pages (``http.DebugRoutes``), with the workers' connections."""

    def __init__(self, local: DebugHandlers, pool: PushWorkerPool) -> None:
        self.local = local
        self.pool = pool

    def routes(self) -> list[web.RouteDef]:
        return [page_route(name, self.page(name)) for name in self.local.pages]

    def page(self, name: str) -> AsyncPage:
        """``/debug/<name>`` for the whole pool."""
        local = self.local.pages[name]
        merge = _GATHERED.get(name)

        async def gathered(query: Mapping[str, str], scope: str) -> web.Response:
            # The main process's own answer first: adsz?push=true starts the push there (the
            # workers get it through the change log), and a refusal is the main process's to give.
            mine = local(query, scope)
            if mine.status != 200:
                return mine
            assert merge is not None
            answers = await self.pool.call_all("page", name, _reading(query), scope)
            return merge(mine, [a for a in answers if a[0] == 200])

        async def one_proxy(query: Mapping[str, str], scope: str) -> web.Response:
            answers = await self.pool.call_all("page", name, dict(query), scope)
            found = next((body for status, body in answers if status == 200), None)
            if found is None:
                return local(query, scope)
            return web.Response(body=found, content_type="application/json")

        async def own(query: Mapping[str, str], scope: str) -> web.Response:
            return local(query, scope)

        if name == "ui":
            return self.ui
        if merge is not None:
            return gathered
        return one_proxy if name in _ONE_PROXY else own

    async def ui(self, query: Mapping[str, str], scope: str) -> web.Response:
        """``/debug/ui``: the pushes as the main process records them, each worker's streams and
        what each sent."""
        views: list[debug_ui.StreamView] = await self.pool.call_all("ui_view", scope)
        server = self.local.sources.server
        text = debug_ui.render(debug_ui.merge_views(views), server.history, server.push_context, query, scope)
        return debug_ui.response(text)

    async def render(self, name: str, query: Mapping[str, str], scope: str) -> Answer:
        """As ``DebugHandlers.render``, for the whole pool."""
        if name not in self.local.pages:
            return self.local.render(name, query, scope)
        response = await self.page(name)(query, scope)
        return response.status, _body(response)

    async def client_configs(self, scope: str) -> list[tuple[str, bytes]]:
        answers = await self.pool.call_all("client_configs", scope)
        return sorted((resource for answer in answers for resource in answer), key=lambda r: r[0])

    async def config_dump(self, proxy_id: str, scope: str) -> list[bytes] | None:
        # The first matching connection by ID, as one process would pick it.
        found = [answer for answer in await self.pool.call_all("config_dump", proxy_id, scope) if answer]
        return min(found)[1] if found else None

    def handlers(self) -> Handlers:
        """What a worker asks the main process (its ``WorkerFleet``)."""
        return {"page": self.render, "client_configs": self.client_configs, "config_dump": self.config_dump}


def _reading(query: Mapping[str, str]) -> dict[str, str]:
    """The query for the workers: the push ``adsz?push=true`` asks for is the main process's."""
    return {key: value for key, value in query.items() if key != "push"}
