"""Who may read the ``/debug`` pages, as istiod decides it (``allowAuthenticatedOrLocalhost``).

- A loopback caller may read everything (istiod talking to itself, ``kubectl port-forward``).
- Anyone else must present a bearer token (or client certificate) that the xDS authenticators
  accept, else 401. A caller of the system namespace may read every page; a caller of another
  namespace only ``/debug/config_dump`` of a proxy in its own namespace, else 403 (istiod also
  allows ``ndsz`` and ``edsz``, which meshpilot does not serve).
- ``?push=true`` pushes to every proxy: only from loopback, whoever the caller is (istiod lets an
  authenticated caller do it; a debug reader should not be able to load the whole fleet).

Without Kubernetes no token can be reviewed, so only loopback callers get the pages: the debug
port is, in effect, on localhost.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable, Sequence

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from meshpilot.bounded_logs import clip
from meshpilot.ca.authenticate import Authenticator, authenticate

log = logging.getLogger(__name__)

#: Pages a caller outside the system namespace may read, for proxies of its own namespace.
_NAMESPACED_PAGES = frozenset({"/debug/config_dump"})


def is_loopback(remote: str | None) -> bool:
    try:
        return remote is not None and ipaddress.ip_address(remote).is_loopback
    except ValueError:
        return False  # a Unix socket or a name: not a loopback address


def _namespace(identities: Sequence[str]) -> str:
    """The namespace of the first SPIFFE identity (``spiffe://TD/ns/NS/sa/SA``), else ""."""
    for identity in identities:
        parts = identity.removeprefix("spiffe://").split("/")
        if len(parts) == 5 and parts[1] == "ns":
            return parts[2]
    return ""


def debug_access(
    authenticators: Callable[[], Sequence[Authenticator]],
    system_namespace: str,
    *,
    allowed_namespaces: frozenset[str] = frozenset(),
    authorize: bool = True,
) -> Middleware:
    """An aiohttp middleware applying the rules above to every path under ``/debug``.

    ``allowed_namespaces`` (DEBUG_ENDPOINT_AUTH_ALLOWED_NAMESPACES) read as the system namespace
    does; ``authorize`` False (ENABLE_DEBUG_ENDPOINT_AUTH=false) lets any authenticated caller read
    every page.
    """

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith("/debug"):
            return await handler(request)
        if is_loopback(request.remote):
            return await handler(request)
        if request.query.get("push") == "true":
            return web.Response(status=403, text="pushes are triggered only from localhost\n")
        metadata = [(k.lower(), v) for k, v in request.headers.items() if k.lower() == "authorization"]
        caller = await authenticate(authenticators(), {}, metadata)
        if caller is None:
            log.info("debug: refused %s %s: not authenticated", request.remote, clip(request.path))
            return web.Response(status=401)
        namespace = _namespace(caller.identities)
        if authorize and namespace != system_namespace and namespace not in allowed_namespaces:
            proxy_namespace = request.query.get("proxyID", "").rpartition(".")[2]
            if request.path not in _NAMESPACED_PAGES or not namespace or proxy_namespace != namespace:
                log.info("debug: refused %s: %s", clip(", ".join(caller.identities)), clip(request.path))
                return web.Response(status=403)
        return await handler(request)

    return guard
