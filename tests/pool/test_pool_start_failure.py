"""A server whose xDS port is taken says so and exits: one process at once, a pool once its workers
failed three times in a row (instead of never becoming ready)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from support.processes import Meshpilot

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _exit_with_port_taken(tmp_path: Path, workers: int) -> tuple[Meshpilot, int, str, float]:
    """Start a server whose xDS port another socket holds (without SO_REUSEPORT, so no process of
    ours can bind it); its exit code, log and how long it took to exit."""
    config = tmp_path / "config"
    config.mkdir()
    server = Meshpilot(tmp_path, config, extra=["--push-workers", str(workers)])
    blocker = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    blocker.bind(("127.0.0.1", server.grpc_port))
    blocker.listen()
    try:
        server.start()
        assert server.proc is not None
        started = time.monotonic()
        code = server.proc.wait(45)
        return server, code, server.log(), time.monotonic() - started
    finally:
        server.stop()
        blocker.close()


def test_workers_that_cannot_bind_the_xds_port_stop_the_server(tmp_path: Path) -> None:
    server, code, log, took = _exit_with_port_taken(tmp_path, workers=2)
    assert code == 1, log[-3000:]
    assert "exited 3 times in a row before serving" in log, log[-3000:]
    assert f"cannot listen on 127.0.0.1:{server.grpc_port} for xDS" in log
    # Three starts a second or more apart, each importing for about a second: well under 45 s.
    assert took < 30, took


def test_one_process_says_which_port_it_cannot_have(tmp_path: Path) -> None:
    server, code, log, _ = _exit_with_port_taken(tmp_path, workers=1)
    assert code == 1, log[-2000:]
    assert f"meshpilot: cannot listen on 127.0.0.1:{server.grpc_port} for xDS" in log, log[-2000:]
    assert "Traceback" not in log, log[-2000:]
