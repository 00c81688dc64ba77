"""What an aborted ADS stream leaves for the cyclic collector.

grpc keeps an abort's exception in a reference cycle with the call's state until a full collection.
The stream, the requests it read and what it made of them (a refused megabyte node ID) must not stay
with it: they are freed by reference counting as the stream ends (``serve_stream``), which this test
checks with the collector off.
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

from meshpilot.xds.sotw_stream import SotwStream

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
MEGABYTE = 1_000_000


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


async def _freed(ref: weakref.ref[SotwStream]) -> bool:
    for _ in range(100):
        if ref() is None:
            return True
        await asyncio.sleep(0.02)
    return False


def _megabytes_held() -> int:
    """Strings and bytes of a megabyte or more that objects the collector tracks (frames, generators,
    exceptions) still hold."""
    return sum(
        1
        for holder in gc.get_objects()
        for value in gc.get_referents(holder)
        if isinstance(value, (bytes, str)) and len(value) >= MEGABYTE
    )


@pytest.mark.usefixtures("no_cyclic_collector")
async def test_a_stream_refused_after_admission_keeps_nothing_it_read(
    tmp_path: Path, streams: list[weakref.ref[SotwStream]]
) -> None:
    config = tmp_path / "config"
    write(config / "apps.yaml", workload("reviews", "default", "10.96.0.20", 9080, {"r1": "127.0.0.21"}))
    async with running(settings_for(config, max_requests_per_second=100_000.0)) as app:
        target = str(app.settings.grpc_addr)
        # A megabyte node ID: read and parsed, then refused with INVALID_ARGUMENT by the stream itself.
        err = await refusal(target, lambda c: c.send(CDS, node_id="x" * MEGABYTE))
        assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert streams, "the stream was admitted"
        assert all([await _freed(ref) for ref in streams]), "a refused stream outlived its call"
        assert _megabytes_held() == 0, "the refused request is still held"

        # A stream its client closes is freed too.
        served = AdsClient(target)
        served.send(CDS, node_id=NODE)
        served.ack(await served.recv())
        await served.close()
        assert await _freed(streams[-1])
