"""Starting, serving the shipped example, and stopping on signals."""

from __future__ import annotations

import re
import shutil
import signal
import time
from pathlib import Path

import pytest
from support.processes import Envoy, Meshpilot, free_port, http_get
from support.wait import eventually

pytestmark = [pytest.mark.integration]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_cleanly_within_seconds(tmp_path, sig):
    mp = Meshpilot(tmp_path, EXAMPLES / "config", extra=["--mesh-config", str(EXAMPLES / "mesh.yaml")])
    mp.start()
    try:
        mp.wait_ready()
        started = time.monotonic()
        assert mp.proc is not None
        mp.proc.send_signal(sig)
        assert mp.proc.wait(10) == 0
        assert time.monotonic() - started < 5
    finally:
        mp.stop()
    lines = [line for line in mp.log().splitlines() if line]
    # istiod's line: time, level, the scope (none for the default scope), the message.
    level = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z\t(debug|info|warn|error)\t(\w+\t)?\S")
    assert lines, "it logged"
    assert all(level.match(line) for line in lines), "every log line is one line with a level"
    assert any("shutting down" in line for line in lines)


def test_bad_flags_and_mesh_config_fail_with_a_clear_message(tmp_path):
    bad_mesh = tmp_path / "mesh.yaml"
    bad_mesh.write_text("connectTimeout: soon\n")
    mp = Meshpilot(tmp_path, EXAMPLES / "config", mesh_config=bad_mesh)
    mp.start()
    assert mp.proc is not None
    assert mp.proc.wait(20) == 2
    assert "mesh.connectTimeout: invalid duration 'soon'" in mp.log()


@pytest.mark.envoy
def test_the_shipped_example_routes_traffic(tmp_path):
    """What `make run` serves, with the example Envoy bootstrap, on its documented addresses."""
    import yaml
    from support.backends import Backend

    config = tmp_path / "config"
    shutil.copytree(EXAMPLES / "config", config)
    mp = Meshpilot(tmp_path, config, mesh_config=EXAMPLES / "mesh.yaml")
    bootstrap = yaml.safe_load((EXAMPLES / "envoy" / "productpage.yaml").read_text())
    admin = free_port()
    bootstrap["admin"]["address"]["socket_address"]["port_value"] = admin
    xds = bootstrap["static_resources"]["clusters"][0]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
    xds["endpoint"]["address"]["socket_address"]["port_value"] = mp.grpc_port
    envoy = Envoy(tmp_path, "productpage", bootstrap, admin)
    backends = [
        Backend("reviews-v1", "127.0.0.21", 9080).start(),
        Backend("reviews-v2", "127.0.0.22", 9080).start(),
    ]
    try:
        mp.start()
        mp.wait_ready()
        envoy.start()
        envoy.wait_live()
        assert envoy.rejected_updates() == {}

        def reviews() -> bool:
            status, _, _ = http_get("127.0.0.11", 9080, "/", {"Host": "reviews"})
            return status == 200

        eventually(reviews, what="the example routes reviews")
        _status, body, _ = http_get("127.0.0.11", 9080, "/", {"Host": "reviews", "end-user": "jason"})
        assert b"reviews-v2" in body
    finally:
        envoy.stop()
        mp.stop()
        for backend in backends:
            backend.stop()
