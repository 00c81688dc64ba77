"""JWKS in a push-worker pool: fetched once by the main process, served by every worker, and by a
worker that starts again at once (it gets the keys in its snapshot, not by fetching on its own)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.jwks_server import JwksServer
from support.jwt_signer import ISSUER, Signer
from support.kube import endpoint_slice, istio, pod, service
from support.pool_fetch import Served, fetch
from support.processes import Meshpilot
from support.wait import eventually

from meshpilot.xds.types import TypeUrl

pytestmark = [pytest.mark.integration]

POD_IP = "127.0.17.11"
JWKS_HOST = "127.0.17.31"
NODE = f"sidecar~{POD_IP}~reviews-1.default~default.svc.cluster.local"
METADATA: dict[str, Any] = {
    "NAMESPACE": "default",
    "ISTIO_VERSION": "1.28.0",
    "LABELS": {"app": "reviews"},
    "INSTANCE_IPS": POD_IP,
}


def _objects(jwks_uri: str) -> list[dict[str, Any]]:
    rule = {"issuer": ISSUER, "jwksUri": jwks_uri, "timeout": "5s"}
    return [
        service("reviews", "default", "10.0.17.1", [("http", 9080)], {"app": "reviews"}),
        pod("reviews-1", "default", POD_IP, {"app": "reviews"}),
        endpoint_slice("reviews", "default", "reviews", [("http", 9080)], [("reviews-1", POD_IP)]),
        istio(
            "RequestAuthentication",
            "jwt",
            "default",
            {"selector": {"matchLabels": {"app": "reviews"}}, "jwtRules": [rule]},
            group="security",
        ),
    ]


def _has_keys(served: Served, signer: Signer) -> bool:
    return any(
        signer.modulus in value.decode("latin-1") for value in served.resources[TypeUrl.LISTENER].values()
    )


@pytest.mark.timeout(120)
async def test_keys_fetched_once_and_served_by_every_worker_and_a_restarted_one(tmp_path: Path) -> None:
    signer = Signer("k1")
    keys = JwksServer(JWKS_HOST, signer.jwks())
    keys.release()
    config = tmp_path / "config"
    config.mkdir()
    (config / "mesh.yaml").write_text(yaml.safe_dump_all(_objects(keys.uri)))
    server = Meshpilot(tmp_path, config, extra=["--push-workers", "2"])
    server.start()
    try:
        await asyncio.to_thread(server.wait_ready)
        assert server.proc is not None
        where = (server.proc.pid, server.grpc_port)
        target = f"127.0.0.1:{server.grpc_port}"

        async def served() -> Served:
            return await fetch(target, NODE, METADATA, delta=False, server=where)

        # The first generation asks for the keys; the push that brings them reaches every worker.
        for _ in range(100):
            got = await served()
            if _has_keys(got, signer):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the keys never reached the proxy")
        by_worker: dict[int, bool] = {}
        for _ in range(40):
            got = await served()
            by_worker[got.process] = _has_keys(got, signer)
            if len(by_worker) == 2:
                break
        assert by_worker == {pid: True for pid in by_worker} and len(by_worker) == 2, by_worker
        # Fetched by the main process only, not once per worker.
        assert keys.requests == 1, keys.requests

        # A worker killed: the one that replaces it has the keys from its first answer on.
        victim = next(iter(by_worker))
        os.kill(victim, signal.SIGKILL)
        eventually(lambda: "push worker" in server.log() and "starting it again" in server.log(), timeout=10)
        fresh: Served | None = None
        for _ in range(200):
            got = await served()
            if got.process not in by_worker:
                fresh = got
                break
            await asyncio.sleep(0.05)
        assert fresh is not None, "no stream reached the restarted worker"
        assert _has_keys(fresh, signer), "the restarted worker served the deny-all key set"
        assert keys.requests == 1, keys.requests
    finally:
        server.stop()
        keys.close()
