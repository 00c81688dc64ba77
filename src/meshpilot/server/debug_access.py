"""Who may read the ``/debug`` pages over HTTP (istiod's ``allowAuthenticatedOrLocalhost``).

This middleware only authenticates; what an authenticated caller may read is ``DebugAccess``'s
rule, the one the xDS debug types apply (``xds.debug_access``).

- A loopback caller may read everything, unscoped (istiod talking to itself, ``kubectl
  port-forward``).
- Anyone else must present a bearer token (``Authorization: Bearer``) that the xDS authenticators
  accept, else 401. HTTP debug callers authenticate with a token only: the debug ports are plain
  HTTP, so there is no client certificate to check.
- The caller's identity then goes to ``DebugAccess.page_scope``: a refusal is a 403 (a 401 if the
  token proved no identity), and the scope it returns, the namespace the caller is limited to, is
  put on the request (``SCOPE``) for the page to apply. A page finds the proxy it is asked about only
  within that namespace, so a name that merely contains another namespace's proxy ID finds nothing.
- ``?push=true`` pushes to every proxy: only from loopback, whoever the caller is (istiod lets an
  authenticated caller do it; a debug reader should not be able to load the whole fleet).

Without Kubernetes no token can be reviewed, so only loopback callers get the pages: the debug
port is, in effect, on localhost.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable, Sequence

import grpc
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from meshpilot.bounded_logs import clip
from meshpilot.ca.authenticate import Authenticator, authenticate
from meshpilot.xds.debug_access import DebugAccess, DebugRefused, judged_identity

log = logging.getLogger(__name__)

#: The namespace the caller is limited to ("" for all), set by the middleware on every request
#: under ``/debug`` it lets through; a page reached without it refuses (``server.debug``).
SCOPE = web.RequestKey("debug_scope", str)


def is_loopback(remote: str | None) -> bool:
    try:
        return remote is not None and ipaddress.ip_address(remote).is_loopback
    except ValueError:
        return False  # a Unix socket or a name: not a loopback address


def debug_access(
    authenticators: Callable[[], Sequence[Authenticator]],
    system_namespace: Callable[[], str],
    access: DebugAccess,
) -> Middleware:
    """An aiohttp middleware applying the rules above to every path under ``/debug``.

    ``system_namespace`` is read per request: it is the mesh root namespace, which mesh config may
    change. ``access`` is the same rule the xDS debug generators are given.
    """

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith("/debug"):
            return await handler(request)
        if is_loopback(request.remote):
            request[SCOPE] = ""
            return await handler(request)
        if request.query.get("push") == "true":
            return web.Response(status=403, text="pushes are triggered only from localhost\n")
        metadata = [(k.lower(), v) for k, v in request.headers.items() if k.lower() == "authorization"]
        # No TLS auth context: a client certificate cannot reach a plain HTTP port.
        caller = await authenticate(authenticators(), {}, metadata)
        if caller is None:
            log.info("debug: refused %s %s: not authenticated", request.remote, clip(request.path))
            return web.Response(status=401)
        identity = judged_identity(caller.identities)
        try:
            scope = access.page_scope(identity, request.path.removeprefix("/debug/"), system_namespace())
        except DebugRefused as refused:
            log.info("debug: refused %s %s: %s", clip(identity), clip(request.path), clip(str(refused)))
            return web.Response(status=401 if refused.code is grpc.StatusCode.UNAUTHENTICATED else 403)
        request[SCOPE] = scope
        return await handler(request)

    return guard
