"""``POST /debug/preview``: the change preview over HTTP, for ``meshpilot preview`` and for callers
that would ask before applying (a CI step, an admission hook).

The body is the change, YAML or JSON, one or more objects (``kind: List`` too). Query parameters:
``delete=true`` previews deleting the named objects instead, ``namespace=`` is the namespace of
objects that name none (default ``default``). The answer is JSON (``push.preview.preview``): 200
with ``valid: false`` and the errors when the webhook would refuse an object (nothing else is
computed then), 400 when the body cannot be read at all, 413 when it is larger than
``MAX_BODY_BYTES``, 429 while another preview runs: each holds a copy of the config and two
snapshots, so one at a time keeps that memory to one copy.

It is served on the monitoring port, on the server's event loop: the body must be read on the loop
that received the request, which the HTTP port's forwarding to the main loop does not allow.
"""

from __future__ import annotations

import orjson
from aiohttp import web

from meshpilot.push.preview import MAX_BODY_BYTES, preview
from meshpilot.push.preview_change import ChangeReader, PreviewError
from meshpilot.push.preview_scratch import PreviewSources
from meshpilot.server.debug_access import SCOPE

PATH = "/debug/preview"
#: ``delete=``: any other value is refused, never read as false.
_BOOLEANS = {"true": True, "1": True, "false": False, "0": False, "": False}


def preview_route(sources: PreviewSources) -> web.RouteDef:
    reader = ChangeReader()
    running = False

    async def handler(request: web.Request) -> web.Response:
        nonlocal running
        scope = request.get(SCOPE)
        if scope is None:
            return web.Response(status=403, text="debug access is not configured\n")
        if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
            return web.Response(status=413, text=f"a change is at most {MAX_BODY_BYTES} bytes\n")
        body = await _bounded_body(request)
        if body is None:
            return web.Response(status=413, text=f"a change is at most {MAX_BODY_BYTES} bytes\n")
        if sources.server.push_context is None:
            return web.Response(status=503, text="the server is not ready\n")
        if running:
            return web.Response(status=429, text="another preview is running\n", headers={"Retry-After": "1"})
        delete = request.query.get("delete", "false")
        if delete not in _BOOLEANS:
            return web.Response(status=400, text=f"delete must be true or false, not {delete[:40]!r}\n")
        try:
            change = reader.read(
                body,
                sources.env.store,
                delete=_BOOLEANS[delete],
                default_namespace=request.query.get("namespace") or "default",
            )
        except PreviewError as err:
            return web.Response(status=400, text=f"{err}\n")
        running = True
        try:
            result = await preview(sources, change, scope=scope)
        finally:
            running = False
        return web.Response(
            body=orjson.dumps(result, option=orjson.OPT_INDENT_2), content_type="application/json"
        )

    return web.post(PATH, handler)


async def _bounded_body(request: web.Request) -> bytes | None:
    """The whole body, or None once it passes ``MAX_BODY_BYTES``. One ``read(n)`` returns what has
    arrived so far, not n bytes: a body sent in several chunks would be cut short."""
    body = bytearray()
    while chunk := await request.content.read(MAX_BODY_BYTES + 1 - len(body)):
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            return None
    return bytes(body)
