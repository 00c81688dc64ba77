"""The agent's status server on ``statusPort`` (15020), as pilot-agent serves it to the kubelet and to
Prometheus.

- ``/healthz/ready``: 200 once Envoy has accepted its first CDS and LDS update from the control plane
  (``cluster_manager.cds.update_success`` and ``listener_manager.lds.update_success`` > 0) and is LIVE
  with its workers started (``server.state`` 0, ``listener_manager.workers_started`` 1), read from
  Envoy's admin ``/stats``; both facts are remembered once true, as pilot-agent does. 503 with the reason
  otherwise. Envoy's own 15021 listener routes here through the bootstrap's ``agent`` cluster.
- ``/app-health/<container>/<livez|readyz|startupz>``: the application probes the injector rewrote,
  from ``ISTIO_KUBE_APP_PROBERS``. ``httpGet`` is sent to the pod IP and the app's port, the app's status
  answered (redirects as 200); ``tcpSocket`` is a connect, 200 or 500. gRPC probes answer 500 (not
  supported by this agent yet).
- ``/stats/prometheus``: Envoy's Prometheus text (``ENVOY_PROMETHEUS_PORT``) followed by the agent's
  own metrics (``prometheus_client``'s default registry).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import prometheus_client
from aiohttp import web

log = logging.getLogger(__name__)

READINESS_TIMEOUT = 3.0
DEFAULT_PROBE_TIMEOUT = 1.0
#: Bound on the app's probe body passed back to the kubelet.
MAX_PROBE_BODY = 10 * 1024
UPDATE_STATS = r"^(cluster_manager\.cds|listener_manager\.lds)\.(update_success|update_rejected)$"
READY_STATS = r"^(server\.state|listener_manager\.workers_started)"


def parse_stats(text: str) -> dict[str, int]:
    """Envoy's ``/stats`` text: ``name: value`` lines, integers only."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, value = line.partition(": ")
        if sep and value.strip().isdigit():
            out[name.strip()] = int(value)
    return out


class ReadinessProbe:
    """Envoy's readiness from its admin stats; each condition is kept once it has held."""

    def __init__(self, admin_port: int, session: aiohttp.ClientSession) -> None:
        self._admin = f"http://127.0.0.1:{admin_port}"
        self._session = session
        self._received_config = False
        self._live = False

    def reset(self) -> None:
        """A new Envoy: forget what the old one had reached."""
        self._received_config = False
        self._live = False

    async def _stats(self, pattern: str) -> dict[str, int]:
        url = f"{self._admin}/stats"
        timeout = aiohttp.ClientTimeout(total=READINESS_TIMEOUT)
        async with self._session.get(url, params={"usedonly": "", "filter": pattern}, timeout=timeout) as r:
            return parse_stats(await r.text())

    async def check(self) -> str | None:
        """None when ready, else why not."""
        try:
            if not self._received_config:
                s = await self._stats(UPDATE_STATS)
                cds = s.get("cluster_manager.cds.update_success", 0)
                lds = s.get("listener_manager.lds.update_success", 0)
                cds_rejected = s.get("cluster_manager.cds.update_rejected", 0)
                lds_rejected = s.get("listener_manager.lds.update_rejected", 0)
                summary = (
                    f"cds updates: {cds} successful, {cds_rejected} rejected; "
                    f"lds updates: {lds} successful, {lds_rejected} rejected"
                )
                if not (cds and lds):
                    if not cds and not lds:
                        return f"config not received from XDS server: {summary}"
                    return f"config not fully received from XDS server: {summary}"
                self._received_config = True
            if not self._live:
                s = await self._stats(READY_STATS)
                if "server.state" not in s or "listener_manager.workers_started" not in s:
                    return "Envoy's server.state or workers_started is not yet updated"
                if s["server.state"] != 0 or s["listener_manager.workers_started"] != 1:
                    return f"Envoy is not LIVE yet (server.state {s['server.state']})"
                self._live = True
        except (aiohttp.ClientError, TimeoutError, OSError) as err:
            return f"Envoy's admin API is not answering: {err or type(err).__name__}"
        return None


@dataclass(frozen=True, slots=True)
class StatusOptions:
    port: int
    admin_port: int
    prometheus_port: int
    app_probers: Mapping[str, Any]
    #: Where app probes are sent: the pod IP (pilot-agent's default), or ``localhost``.
    probe_host: str = "localhost"
    #: Address to listen on; None for all.
    host: str | None = None


class StatusServer:
    """The aiohttp server on statusPort; ``start``/``shutdown``, or ``async with``."""

    def __init__(self, options: StatusOptions) -> None:
        self.options = options
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.readiness: ReadinessProbe | None = None

    async def __aenter__(self) -> StatusServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def start(self) -> None:
        for path, prober in self.options.app_probers.items():
            if not isinstance(prober, dict) or not ({"httpGet", "tcpSocket"} & prober.keys()):
                # Said at start, not only at each probe: the kubelet will restart the pod for it.
                log.warning("app probe %s is not an httpGet or tcpSocket probe; it will fail (500)", path)
        self._session = aiohttp.ClientSession()
        self.readiness = ReadinessProbe(self.options.admin_port, self._session)
        app = web.Application()
        app.router.add_get("/healthz/ready", self._ready)
        app.router.add_get("/app-health/{container}/{kind}", self._app_health)
        app.router.add_get("/stats/prometheus", self._prometheus)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        try:
            await self._runner.setup()
            await web.TCPSite(self._runner, self.options.host, self.options.port).start()
        except BaseException:
            await self.shutdown()
            raise
        log.info("status server listening on %s", self.options.port)

    async def shutdown(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def reset_readiness(self) -> None:
        if self.readiness is not None:
            self.readiness.reset()

    async def _ready(self, _: web.Request) -> web.Response:
        assert self.readiness is not None
        reason = await self.readiness.check()
        if reason is None:
            return web.Response(status=200)
        log.debug("not ready: %s", reason)
        return web.Response(status=503, text=reason)

    async def _app_health(self, request: web.Request) -> web.Response:
        prober = self.options.app_probers.get(request.path)
        if not isinstance(prober, dict):
            return web.Response(status=404, text=f"no probe configured for {request.path}")
        timeout = float(prober.get("timeoutSeconds") or DEFAULT_PROBE_TIMEOUT)
        if isinstance(prober.get("httpGet"), dict):
            return await self._http_probe(request, prober["httpGet"], timeout)
        if isinstance(prober.get("tcpSocket"), dict):
            return await self._tcp_probe(prober["tcpSocket"], timeout)
        return web.Response(status=500, text="this agent runs only httpGet and tcpSocket probes")

    async def _http_probe(
        self, request: web.Request, action: Mapping[str, Any], timeout: float
    ) -> web.Response:
        assert self._session is not None
        path = str(action.get("path") or "/")
        path = path if path.startswith("/") else "/" + path
        port = int(action["port"])
        host = str(action.get("host") or self.options.probe_host)
        https = str(action.get("scheme", "HTTP")).upper() == "HTTPS"
        url = f"{'https' if https else 'http'}://{_join(host, port)}{path}"
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        # The kubelet's Host names the status port; the app is asked under its own port.
        name, _, asked_port = request.host.rpartition(":")
        headers["Host"] = f"{name}:{port}" if asked_port == str(self.options.port) else request.host
        for header in action.get("httpHeaders") or []:
            headers[str(header["name"])] = str(header.get("value", ""))
        try:
            async with self._session.get(
                url,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout),
                allow_redirects=False,
                # The kubelet does not verify the app's certificate either.
                ssl=not https,
            ) as response:
                body = await response.content.read(MAX_PROBE_BODY)
                status = 200 if 300 <= response.status < 400 else response.status
                return web.Response(status=status, body=body)
        except (aiohttp.ClientError, TimeoutError, OSError) as err:
            log.info("app probe %s failed: %s", url, err or type(err).__name__)
            return web.Response(status=500)

    async def _tcp_probe(self, action: Mapping[str, Any], timeout: float) -> web.Response:
        host = str(action.get("host") or self.options.probe_host)
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(action["port"])), timeout)
        except (OSError, TimeoutError):
            return web.Response(status=500)
        writer.close()
        return web.Response(status=200)

    async def _prometheus(self, _: web.Request) -> web.Response:
        assert self._session is not None
        url = f"http://127.0.0.1:{self.options.prometheus_port}/stats/prometheus"
        envoy = b""
        try:
            timeout = aiohttp.ClientTimeout(total=READINESS_TIMEOUT)
            async with self._session.get(url, timeout=timeout, headers={"Accept-Encoding": "identity"}) as r:
                envoy = await r.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as err:
            log.info("cannot read Envoy's metrics: %s", err or type(err).__name__)
        if envoy and not envoy.endswith(b"\n"):
            envoy += b"\n"
        own = prometheus_client.generate_latest()
        return web.Response(body=envoy + own, content_type="text/plain", charset="utf-8")


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
