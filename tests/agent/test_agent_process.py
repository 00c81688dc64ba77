"""``meshpilot agent proxy sidecar`` run as the injected istio-proxy container runs it, with real processes.

The harness is the one the real pilot-agent runs in (``support.agent_harness``): the same injected args,
environment and files, ``meshpilot agent`` in place of ``pilot-agent``, controlPlaneAuthPolicy NONE, the
workload certificate mounted as files and ``ISTIO_DELTA_XDS=false`` (meshpilot's discovery serves no delta
yet). Shown: Envoy started by the agent gets its config from meshpilot through the agent's xDS proxy and
routes a request; ``/healthz/ready`` on the status port and Envoy's 15021 listener answer 200; the app's
rewritten readiness probe reaches the app; a killed Envoy is started again; SIGTERM stops everything
within terminationDrainDuration plus a bound.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from integration.conftest import ca, mesh  # noqa: F401  (the integration fixtures)
from support.agent_harness import (
    MESHPILOT_AGENT,
    POD_IP,
    SERVICE_PORT,
    AgentRun,
    check_traffic,
    prepare_agent,
    start_mesh,
    wait_ready,
)
from support.golden import AGENT_ISTIO_VERSION
from support.processes import http_get
from support.wait import eventually

pytestmark = [pytest.mark.integration, pytest.mark.envoy]

#: The app's own port for its readiness probe (Envoy's listener holds POD_IP:9080).
PROBE_PORT = SERVICE_PORT + 1
#: terminationDrainDuration for the SIGTERM case, and the bound on what comes after it.
TERMINATION_DRAIN = 2.0
STOP_BOUND = 8.0


def _envoy_pid(admin_port: int) -> int:
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"envoy") and b"--disable-hot-restart" in argv:
            try:
                with open(f"/proc/{entry}/cwd/etc/istio/proxy/envoy-rev.json", "rb") as bootstrap:
                    if f'"port_value": {admin_port}'.encode() in bootstrap.read():
                        return int(entry)
            except OSError:
                continue
    raise AssertionError(f"no Envoy with admin port {admin_port}")


def test_meshpilot_agent_runs_envoy_like_pilot_agent(mesh, ca) -> None:  # noqa: F811
    start_mesh(mesh)
    app = mesh.backend("productpage-app", POD_IP, PROBE_PORT)
    assert app is not None
    inputs = prepare_agent(
        mesh,
        ca,
        proxy_config={
            "controlPlaneAuthPolicy": "NONE",
            "terminationDrainDuration": f"{TERMINATION_DRAIN:g}s",
        },
        mounted_certs=True,
        extra_env={"ISTIO_DELTA_XDS": "false"},
        probe_port=PROBE_PORT,
    )
    assert inputs.args[:2] == ["proxy", "sidecar"]
    agent = inputs.launch(mesh, MESHPILOT_AGENT, "meshpilot-agent")
    run = AgentRun(agent, inputs.env, inputs.ports, AGENT_ISTIO_VERSION)
    wait_ready(agent)
    check_traffic(mesh, run)
    assert run.agent.bootstrap()["dynamic_resources"]["ads_config"]["api_type"] == "GRPC"

    # The injector rewrote the app's probe to the agent; the agent sends it to the app on the pod IP.
    [container] = [c for c in inputs.pod["spec"]["containers"] if c["name"] == "productpage"]
    probe = container["readinessProbe"]["httpGet"]
    assert probe["path"] == "/app-health/productpage/readyz"
    assert http_get("127.0.0.1", inputs.ports["status"], probe["path"])[0] == 200
    assert http_get("127.0.0.1", inputs.ports["status"], "/app-health/productpage/livez")[0] == 404
    # Envoy's metrics through the agent.
    status, body, _ = http_get("127.0.0.1", inputs.ports["status"], "/stats/prometheus")
    assert status == 200 and b"envoy_server_live" in body

    # Envoy killed: the agent starts it again, and it becomes ready again.
    first = _envoy_pid(inputs.ports["admin"])
    os.kill(first, signal.SIGKILL)
    eventually(
        lambda: _envoy_pid(inputs.ports["admin"]) != first and agent.ready(),
        timeout=30,
        what="Envoy restarted by the agent and ready",
    )
    assert agent.running
    check_traffic(mesh, run)

    # SIGTERM: drain, wait terminationDrainDuration, stop Envoy, exit 0.
    second = _envoy_pid(inputs.ports["admin"])
    assert agent.proc is not None
    started = time.monotonic()
    agent.proc.send_signal(signal.SIGTERM)
    try:
        code = agent.proc.wait(TERMINATION_DRAIN + STOP_BOUND)
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"the agent did not exit within {TERMINATION_DRAIN + STOP_BOUND}s:\n{agent.log()[-4000:]}"
        )
    elapsed = time.monotonic() - started
    assert code == 0, agent.log()[-4000:]
    assert elapsed >= TERMINATION_DRAIN * 0.9, elapsed
    assert not os.path.exists(f"/proc/{second}") or _zombie(second)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] == "Z"
    except OSError:
        return True
