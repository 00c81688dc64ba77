"""A pool whose workers cannot serve says why and exits, instead of never becoming ready."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from support.processes import Meshpilot


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_workers_that_cannot_bind_the_xds_port_stop_the_server(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir()
    server = Meshpilot(tmp_path, config, extra=["--push-workers", "2"])
    # Held without SO_REUSEPORT: no worker can bind it (one process would fail at once, too).
    blocker = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    blocker.bind(("127.0.0.1", server.grpc_port))
    blocker.listen()
    try:
        server.start()
        assert server.proc is not None
        started = time.monotonic()
        code = server.proc.wait(45)
        took = time.monotonic() - started
        log = server.log()
        assert code == 1, log[-3000:]
        assert "exited 3 times in a row before serving" in log, log[-3000:]
        assert f"cannot listen on 127.0.0.1:{server.grpc_port} for xDS" in log
        # Three starts a second or more apart, each importing for about a second: well under 45 s.
        assert took < 30, took
    finally:
        server.stop()
        blocker.close()


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_one_process_says_which_port_it_cannot_have(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir()
    server = Meshpilot(tmp_path, config, extra=["--push-workers", "1"])
    blocker = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    blocker.bind(("127.0.0.1", server.grpc_port))
    blocker.listen()
    try:
        server.start()
        assert server.proc is not None
        assert server.proc.wait(30) == 1
        log = server.log()
        assert f"meshpilot: cannot listen on 127.0.0.1:{server.grpc_port} for xDS" in log, log[-2000:]
        assert "Traceback" not in log, log[-2000:]
    finally:
        server.stop()
        blocker.close()
