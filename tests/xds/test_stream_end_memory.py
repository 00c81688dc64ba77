"""What an aborted ADS stream leaves for the cyclic collector.

grpc keeps an abort's exception in a reference cycle with the call's state until a full collection.
The stream, the requests it read and what it made of them (a refused megabyte node ID) must not stay
with it: they are freed by reference counting as the stream ends (``serve_stream``), which these tests
check with the collector off.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from support.ads_client import AdsClient, lost_status, refusal
from support.held import MEGABYTE, collector_off, megabytes_held
from support.kube import workload, write
from support.xds_server import NODE, running, settings_for

from meshpilot.server.settings import DiscoverySettings
from meshpilot.xds.sotw_stream import SotwStream

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"


@pytest.fixture
def streams(monkeypatch: pytest.MonkeyPatch) -> list[weakref.ref[SotwStream]]:
    """Weak references to every state-of-the-world stream the server makes."""
    made: list[weakref.ref[SotwStream]] = []
    original = SotwStream.__init__

    def recording(self: SotwStream, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)  # type: ignore[arg-type]
        made.append(weakref.ref(self))

    monkeypatch.setattr(SotwStream, "__init__", recording)
    return made


@pytest.fixture
def no_cyclic_collector() -> Iterator[None]:
    with collector_off():
        yield


async def _freed(ref: weakref.ref[SotwStream]) -> bool:
    for _ in range(100):
        if ref() is None:
            return True
        await asyncio.sleep(0.02)
    return False


def _settings(tmp_path: Path) -> DiscoverySettings:
    """One service, and no new-stream rate limit to wait for."""
    config = tmp_path / "config"
    write(config / "apps.yaml", workload("reviews", "default", "10.96.0.20", 9080, {"r1": "127.0.0.21"}))
    return settings_for(config, max_requests_per_second=100_000.0)


@pytest.mark.usefixtures("no_cyclic_collector")
async def test_a_stream_refused_after_admission_keeps_nothing_it_read(
    tmp_path: Path, streams: list[weakref.ref[SotwStream]]
) -> None:
    async with running(_settings(tmp_path)) as app:
        target = str(app.settings.grpc_addr)
        # A megabyte node ID: read and parsed, then refused with INVALID_ARGUMENT by the stream itself.
        err = await refusal(target, lambda c: c.send(CDS, node_id="x" * MEGABYTE))
        assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert streams, "the stream was admitted"
        assert all([await _freed(ref) for ref in streams]), "a refused stream outlived its call"
        assert megabytes_held() == 0, "the refused request is still held"

        # A stream its client closes is freed too.
        served = AdsClient(target)
        served.send(CDS, node_id=NODE)
        served.ack(await served.recv())
        await served.close()
        assert await _freed(streams[-1])


@pytest.mark.usefixtures("no_cyclic_collector")
async def test_a_served_stream_refused_for_a_later_request_keeps_nothing_it_read(
    tmp_path: Path, streams: list[weakref.ref[SotwStream]]
) -> None:
    """The refusal comes while the stream's reader is between requests, not before the first."""
    async with running(_settings(tmp_path)) as app:
        client = AdsClient(str(app.settings.grpc_addr))
        try:
            client.send(CDS, node_id=NODE)
            client.ack(await client.recv())
            client.send(EDS, ["y" * MEGABYTE])
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await client.recv()
            # grpc.aio may report the race of grpc/grpc#36066 instead of the server's status.
            assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT or lost_status(refused.value)
        finally:
            await client.close()
        assert len(streams) == 1
        assert await _freed(streams[0]), "a refused stream outlived its call"
        assert megabytes_held() == 0, "the refused request is still held"
