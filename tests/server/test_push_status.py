"""``/debug/push_status`` in istiod's shape, and the periodic ``Push Status:`` line."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import weakref
from pathlib import Path

import pytest
from support.kube import service, workload, write
from support.processes import http_get
from support.xds_server import running, settings_for

from meshpilot.model.endpoint import Endpoint
from meshpilot.model.endpoint_index import EndpointIndex
from meshpilot.model.endpoint_shards import ShardKey
from meshpilot.model.protocol import Protocol
from meshpilot.model.service import Port, Resolution, Service
from meshpilot.server.push_status import log_push_status, proxy_status, status_json

EMPTY_CLUSTER = "outbound|8080||lonely.default.svc.cluster.local"


def _config(tmp_path: Path) -> Path:
    config = tmp_path / "config"
    write(
        config / "apps.yaml",
        [
            *workload("reviews", "default", "10.96.0.20", 9080, {"reviews-v1": "127.0.0.21"}),
            # A service no pod backs: its cluster has no instances.
            service("lonely", "default", "10.96.0.40", [("http", 8080)], {"app": "lonely"}),
        ],
    )
    return config


async def test_push_status_lists_clusters_without_instances(tmp_path: Path) -> None:
    settings = settings_for(_config(tmp_path))
    async with running(settings) as app:
        status, body, _ = await asyncio.to_thread(
            http_get, "127.0.0.1", settings.http_addr.port, "/debug/push_status"
        )
        assert status == 200
        parsed = json.loads(body)
        assert parsed == {"pilot_eds_no_instances": {EMPTY_CLUSTER: {}}}
        # Go's MarshalIndent: four spaces.
        assert body.startswith(b'{\n    "pilot_eds_no_instances": {\n        "outbound')
        # The same page over the xDS debug type's renderer.
        assert app.debug.render("push_status", {}, "") == (200, body)


class _Snapshot:
    """A push context as ``proxy_status`` reads it: its services."""

    def __init__(self, *services: Service) -> None:
        self.services = services


def _service(
    host: str, *ports: tuple[str, int], resolution: Resolution = Resolution.CLIENT_SIDE_LB
) -> Service:
    return Service(
        hostname=host,
        namespace="default",
        name=host.split(".")[0],
        ports=tuple(Port(name, number, Protocol.HTTP) for name, number in ports),
        resolution=resolution,
    )


def test_no_instances_per_port_and_only_for_client_side_balancing() -> None:
    index = EndpointIndex()
    shard = ShardKey("Kubernetes", "Kubernetes")
    endpoint = Endpoint("10.0.0.1", 8080, "http")
    index.update_service_endpoints(shard, "a.default.svc.cluster.local", "default", [endpoint])
    snapshot = _Snapshot(
        _service("a.default.svc.cluster.local", ("http", 80), ("grpc", 90)),
        _service("dns.example.com", ("http", 80), resolution=Resolution.DNS_LB),
    )
    assert proxy_status(snapshot, index) == {  # type: ignore[arg-type]
        "pilot_eds_no_instances": {"outbound|90||a.default.svc.cluster.local": {}}
    }
    assert proxy_status(_Snapshot(), index) == {}  # type: ignore[arg-type]
    assert status_json({}) == b"{}"


async def test_push_status_is_logged_once_per_snapshot(caplog: pytest.LogCaptureFixture) -> None:
    snapshots = [_Snapshot(_service("a.default.svc.cluster.local", ("http", 80)))]
    caplog.set_level(logging.INFO, logger="meshpilot.server.push_status")
    task = asyncio.create_task(
        log_push_status(lambda: snapshots[-1], EndpointIndex(), interval=0.01)  # type: ignore[arg-type,return-value]
    )
    await asyncio.sleep(0.1)
    snapshots.append(_Snapshot())  # nothing to say about this one: no line
    await asyncio.sleep(0.1)
    task.cancel()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Push Status: ")]
    assert len(lines) == 1, lines
    assert json.loads(lines[0].removeprefix("Push Status: ")) == {
        "pilot_eds_no_instances": {"outbound|80||a.default.svc.cluster.local": {}}
    }


async def test_the_logger_does_not_keep_a_replaced_snapshot(caplog: pytest.LogCaptureFixture) -> None:
    """A snapshot the logger saw goes once the server replaced it, not an interval later: after a
    large file is removed, the one before held every service of the file."""
    caplog.set_level(logging.INFO, logger="meshpilot.server.push_status")
    snapshots = [_Snapshot(_service("a.default.svc.cluster.local", ("http", 80)))]
    seen = weakref.ref(snapshots[0])
    task = asyncio.create_task(
        log_push_status(lambda: snapshots[-1], EndpointIndex(), interval=0.05)  # type: ignore[arg-type,return-value]
    )
    try:
        await asyncio.sleep(0.2)
        assert any(r.getMessage().startswith("Push Status: ") for r in caplog.records)
        snapshots[:] = [_Snapshot()]
        gc.collect()
        assert seen() is None, "the logger still holds the snapshot it logged"
    finally:
        task.cancel()
