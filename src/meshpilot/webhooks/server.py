"""The HTTPS webhook server (istiod's port 15017): admission review paths and ``/ready``.

Review handlers are registered by path (``add_review_handler``); each is
served at ``path`` and ``path/`` as istiod serves them. The transport checks
shared by every path follow istiod's ``serve``: an empty body is 400, a
Content-Type other than application/json 415, and a body over the API
server's 6 MiB limit is refused with 413 without being read whole.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from meshpilot.ca.serving import ServingCertificate
from meshpilot.server.metrics import Metrics
from meshpilot.server.settings import Address
from meshpilot.webhooks.admission import ReviewHandler, answer
from meshpilot.webhooks.tls import server_context, serving_context
from meshpilot.webhooks.validate import ValidationHandler

log = logging.getLogger(__name__)

#: Kubernetes' limit on request bodies (istiod's kube.MaxRequestBodyBytes).
MAX_BODY_BYTES = 6 * 1024 * 1024


class WebhookServer:
    """Serves ``/validate`` (and any handler added) over HTTPS."""

    def __init__(
        self,
        address: Address,
        metrics: Metrics,
        ready: Callable[[], bool],
        *,
        cert_file: Path | None = None,
        key_file: Path | None = None,
        mesh_certificate: bool = False,
    ) -> None:
        self.address = address
        self.metrics = metrics
        self._ready = ready
        self._cert_file = cert_file
        self._key_file = key_file
        #: istiod's certificate from the mesh CA, used when no files are given; followed on renewal.
        self._mesh_certificate = mesh_certificate and cert_file is None and key_file is None
        #: The certificate from the mesh CA, set before ``start`` when ``serves_mesh_certificate``
        #: (the CA may load after the server is made: on Kubernetes it waits for the API server).
        self.serving: ServingCertificate | None = None
        self._handlers: dict[str, tuple[ReviewHandler, Callable[[int], None] | None]] = {}
        self._runner: web.AppRunner | None = None
        #: PEM of the certificate served, once started (what a caBundle would hold).
        self.cert_pem = b""
        self.add_review_handler(
            "/validate",
            ValidationHandler(metrics),
            on_http_error=lambda status: metrics.validation_http_error.labels(str(status)).inc(),
        )

    @property
    def serves_mesh_certificate(self) -> bool:
        """Whether the webhooks serve istiod's certificate from the mesh CA (no files given), so that
        the root belongs in their configurations' caBundle."""
        return self._mesh_certificate

    def add_review_handler(
        self, path: str, handler: ReviewHandler, *, on_http_error: Callable[[int], None] | None = None
    ) -> None:
        """Serve AdmissionReviews at ``path`` and below it; call before ``start``.

        ``on_http_error`` is told the status of each request refused before
        reaching ``handler`` (each webhook counts those in its own metric).
        """
        if self._runner is not None:
            raise RuntimeError("review handlers must be added before the server starts")
        if not path.startswith("/") or path.endswith("/"):
            raise ValueError(f"review path {path!r} must start with '/' and not end with it")
        self._handlers[path] = (handler, on_http_error)

    def app(self) -> web.Application:
        # client_max_size is one past the limit, so the 413 below is ours, not aiohttp's.
        app = web.Application(client_max_size=MAX_BODY_BYTES + 1)
        routes = [web.get("/ready", self._ready_handler)]
        for path, (handler, on_http_error) in self._handlers.items():
            serve = _review_route(handler, on_http_error)
            # Any method, as istiod's mux: a GET has no body and gets its 400.
            routes += [web.route("*", path, serve), web.route("*", path + "/{tail:.*}", serve)]
        app.add_routes(routes)
        return app

    async def start(self) -> None:
        context: ssl.SSLContext
        if self.serves_mesh_certificate:
            if self.serving is None:
                raise RuntimeError("the webhooks serve the mesh certificate: set `serving` before start")
            context, self.cert_pem = serving_context(self.serving)
        else:
            context, self.cert_pem = server_context(self._cert_file, self._key_file, self.address.host)
        runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(
            runner,
            host=self.address.host or None,
            port=self.address.port,
            ssl_context=context,
            reuse_address=True,
        )
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _ready_handler(self, request: web.Request) -> web.Response:
        if self._ready():
            return web.Response(text="")
        return web.Response(status=503, text="not ready\n")


def _review_route(
    handler: ReviewHandler, on_http_error: Callable[[int], None] | None
) -> Callable[[web.Request], Awaitable[web.Response]]:
    def http_error(status: int, message: str) -> web.Response:
        if on_http_error is not None:
            on_http_error(status)
        return web.Response(status=status, text=message + "\n")

    async def serve(request: web.Request) -> web.Response:
        body = await _read_limited(request)
        if body is None:
            return http_error(413, f"request body too large, limit is {MAX_BODY_BYTES}")
        if not body:
            return http_error(400, "no body found")
        # istiod compares the header exactly; the API server sends exactly this.
        if request.headers.get("Content-Type") != "application/json":
            return http_error(415, "invalid Content-Type, want `application/json`")
        return web.Response(body=answer(body, handler), content_type="application/json")

    return serve


async def _read_limited(request: web.Request) -> bytes | None:
    """The body, or None when it is over MAX_BODY_BYTES (read no further than one byte past)."""
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        return None
    chunks: list[bytes] = []
    size = 0
    # Bounded: every pass adds at least one byte, and the loop ends past the limit.
    while size <= MAX_BODY_BYTES:
        chunk = await request.content.read(min(65536, MAX_BODY_BYTES + 1 - size))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
    return None
