"""What an ended ADS stream leaves for the cyclic collector.

A stream the server refuses after admitting it is freed by reference counting, with the requests it
read (grpc keeps the abort's exception in a cycle with the call, and its traceback's frames held the
stream); only such streams count towards the full collections of ``gc_tuning.EndedStreams``. A stream
its client closed does not, nor do streams refused at admission (test_ads_protocol.py's rate-limit
test): at 5,000 proxies one full collection holds the interpreter for 0.3 s or more (bench/notes.md).
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from support.ads_client import AdsClient, refusal
from support.kube import workload, write
from support.xds_server import NODE, running, settings_for

from meshpilot.xds.server import DiscoveryServer
from meshpilot.xds.sotw_stream import SotwStream

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"


class Counted:
    """Stands in for the server's EndedStreams: counts the ends it is told of."""

    def __init__(self) -> None:
        self.ends = 0

    def ended(self) -> None:
        self.ends += 1


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
    """Only reference counting frees anything while the test runs."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _count_ends(server: DiscoveryServer) -> Counted:
    counted = Counted()
    server.ended_streams = counted  # type: ignore[assignment]
    return counted


async def _freed(ref: weakref.ref[SotwStream]) -> bool:
    for _ in range(100):
        if ref() is None:
            return True
        await asyncio.sleep(0.02)
    return False


@pytest.mark.usefixtures("no_cyclic_collector")
async def test_a_stream_refused_after_admission_is_freed_and_counted(
    tmp_path: Path, streams: list[weakref.ref[SotwStream]]
) -> None:
    config = tmp_path / "config"
    write(config / "apps.yaml", workload("reviews", "default", "10.96.0.20", 9080, {"r1": "127.0.0.21"}))
    async with running(settings_for(config, max_requests_per_second=100_000.0)) as app:
        counted = _count_ends(app.server)
        # A megabyte node ID: read, then refused with INVALID_ARGUMENT by the stream itself.
        err = await refusal(str(app.settings.grpc_addr), lambda c: c.send(CDS, node_id="x" * 1_000_000))
        assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert streams, "the stream was admitted"
        assert all([await _freed(ref) for ref in streams]), "a refused stream outlived its call"
        assert counted.ends == len(streams)

        # A stream its client closes is freed too, and asks for no collection.
        served = AdsClient(str(app.settings.grpc_addr))
        served.send(CDS, node_id=NODE)
        response = await served.recv()
        served.ack(response)
        await served.close()
        assert await _freed(streams[-1])
        assert counted.ends == len(streams) - 1
