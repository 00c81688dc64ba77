"""Stopping an informer whose watch stream its own thread has just closed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import urllib3
from kubernetes import client as kclient
from support.backends import Backend

from bench.server import free_port
from meshpilot.kube.informer import Informer, Pump, Resource


@pytest.fixture
def http_server() -> Iterator[str]:
    backend = Backend("watch", "127.0.0.1", free_port()).start()
    try:
        yield f"http://127.0.0.1:{backend.port}/"
    finally:
        backend.stop()


def test_stop_tolerates_a_watch_stream_closed_at_the_same_moment(http_server: str) -> None:
    loop = asyncio.new_event_loop()
    try:
        informer: Informer[dict[str, object]] = Informer(
            kclient.ApiClient(), Resource("", "v1", "pods", "Pod"), dict, Pump(loop, lambda batch: None)
        )
        # A real streamed response, closed as the informer thread closes one when the API server
        # drops the watch; urllib3 then refuses shutdown() (ValueError, or EBADF when the socket
        # was closed under it).
        with urllib3.PoolManager() as pool:
            response = pool.request("GET", http_server, preload_content=False)
            response.close()
            informer._response = response
            informer.request_stop()
        informer.join()
    finally:
        loop.close()
