"""The ADS protocol tests' server: a DiscoveryApp with three services, in the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from support.ads_client import AdsClient, DeltaClient
from support.kube import workload, write
from support.processes import free_port

from meshpilot.server.app import DiscoveryApp
from meshpilot.server.run import run
from meshpilot.server.settings import Address, DiscoverySettings

NODE = "sidecar~127.0.0.11~productpage-v1.default~default.svc.cluster.local"


class Server:
    def __init__(self, app: DiscoveryApp, config_dir: Path) -> None:
        self.app = app
        self.config_dir = config_dir
        self.target = str(app.settings.grpc_addr)

    def client(self) -> AdsClient:
        return AdsClient(self.target)

    def delta_client(self) -> DeltaClient:
        return DeltaClient(self.target)

    def metric(self, name: str, **labels: str) -> float:
        value = self.app.metrics.registry.get_sample_value(name, labels)
        return value or 0.0


def settings_for(config: Path | None, **overrides: object) -> DiscoverySettings:
    return DiscoverySettings(
        config_dir=config,
        grpc_addr=Address("127.0.0.1", free_port()),
        http_addr=Address("127.0.0.1", free_port()),
        monitoring_addr=Address("127.0.0.1", free_port()),
        webhook_addr=Address("127.0.0.1", free_port()),
        debounce_after=0.02,
        **overrides,  # type: ignore[arg-type]
    )


#: Starting loads the config in a child process, which a busy host may take seconds to start.
READY_WITHIN = 30.0


async def until_ready(app: DiscoveryApp, task: asyncio.Task[None]) -> None:
    """Wait until ``app`` serves (its gRPC server up and ready); fail if it ended or took too long."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + READY_WITHIN
    while not (app.grpc_server is not None and app.server.ready):
        if task.done():
            await task  # its failure, if it failed
            raise AssertionError("the server stopped before it was ready")
        assert loop.time() < deadline, f"the server was not ready within {READY_WITHIN:.0f} s"
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def running(settings: DiscoverySettings) -> AsyncIterator[DiscoveryApp]:
    """A DiscoveryApp serving in this event loop until the block ends."""
    app = DiscoveryApp(settings)
    task = asyncio.create_task(run(app))
    try:
        await until_ready(app, task)
        yield app
    finally:
        app.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)


def apps(reviews: dict[str, str] | None = None, *, ratings: bool = True) -> list[dict[str, object]]:
    """productpage, reviews and ratings in ``default``, each with one endpoint; or reviews with
    other endpoints (pod name to address), or without ratings. Written to ``apps.yaml``."""
    out = [
        *workload("productpage", "default", "10.96.0.10", 9080, {"productpage-v1": "127.0.0.11"}),
        *workload("reviews", "default", "10.96.0.20", 9080, reviews or {"reviews-v1": "127.0.0.21"}),
    ]
    if ratings:
        out += workload("ratings", "default", "10.96.0.30", 9080, {"ratings-v1": "127.0.0.31"})
    return out


@contextlib.asynccontextmanager
async def three_services(tmp_path: Path) -> AsyncIterator[Server]:
    """The three services of ``apps``, served."""
    config = tmp_path / "config"
    write(config / "apps.yaml", apps())
    async with running(settings_for(config)) as app:
        yield Server(app, config)
