"""istiod's command line and environment, as Istio's chart passes them, taken by ``meshpilot discovery``.

The table (``meshpilot.cli.istiod_compat``) is checked against istiod itself (every flag of the reference
``pilot-discovery discovery --help``) and against the chart (every variable of the Deployment that
``istioctl manifest generate`` renders, conftest), and against meshpilot's own code (every ``PILOT_*``
variable the server reads is listed as implemented). Then meshpilot is started with the rendered
Deployment's exact arguments and environment: it gets ready, and logs each setting it does not
implement once, by name.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.kubelet import container_env
from support.processes import Process, free_port, http_get
from support.reference import binary
from support.wait import eventually

from meshpilot.cli import istiod_compat
from meshpilot.cli.istiod_compat import ENV, FLAGS, Support
from meshpilot.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
Objects = list[dict[str, Any]]

#: A value of each kind, for a flag the table does not implement.
SAMPLE = {"duration": "30m", "int": "7", "float": "2.5", "string": "x", "bool": "false"}


def discovery_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser: argparse.ArgumentParser = sub.choices["discovery"]
    return parser


def istiod_deployment(istio_rendered: Callable[..., Objects]) -> dict[str, Any]:
    [deployment] = [
        o for o in istio_rendered() if o["kind"] == "Deployment" and o["metadata"]["name"] == "istiod"
    ]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    found: dict[str, Any] = container
    return found


# -- The table --


@pytest.mark.reference
def test_the_table_has_every_flag_istiod_accepts() -> None:
    help_text = subprocess.run(
        [str(binary("pilot-discovery")), "discovery", "--help"], capture_output=True, text=True, timeout=30
    ).stdout
    istiod = set(re.findall(r"^\s+(?:-\w, )?--([\w-]+)", help_text, re.MULTILINE)) - {"help"}
    assert len(istiod) > 30, help_text
    assert {k.name for k in FLAGS} == istiod


def test_implemented_flags_are_meshpilots_own_options() -> None:
    options = discovery_parser()._option_string_actions
    for knob in FLAGS:
        action = options[f"--{knob.name}"]
        implemented = not isinstance(action, istiod_compat._Record)
        assert implemented == (knob.support is Support.IMPLEMENTED), knob.name
        if knob.short:
            assert options[f"-{knob.short}"] is action


@pytest.mark.parametrize("form", ["--x=y", "--x y"])
@pytest.mark.parametrize(
    "knob", [k for k in FLAGS if k.support is not Support.IMPLEMENTED], ids=lambda k: k.name
)
def test_every_flag_meshpilot_does_not_implement_is_accepted(knob: istiod_compat.Knob, form: str) -> None:
    value = SAMPLE[knob.kind]
    argv = [f"--{knob.name}={value}"] if form == "--x=y" or knob.kind == "bool" else [f"--{knob.name}", value]
    args = discovery_parser().parse_args(argv)
    report = istiod_compat.startup_report(args, {})
    logged = [name for name, _, _ in report.not_implemented]
    assert logged == ([] if knob.is_inert(value) else [f"--{knob.name}"])


@pytest.mark.parametrize(
    ("value", "logged"), [("30m", False), ("1800s", False), ("0h30m0s", False), ("10m", True)]
)
def test_a_value_other_than_meshpilots_own_is_logged(value: str, logged: bool) -> None:
    """meshpilot closes connections after 30 minutes, the chart's value, however it is written."""
    args = discovery_parser().parse_args(["--keepaliveMaxServerConnectionAge", value])
    report = istiod_compat.startup_report(args, {})
    assert bool(report.not_implemented) == logged


def test_a_value_istiod_would_refuse_is_refused() -> None:
    with pytest.raises(SystemExit):
        discovery_parser().parse_args(["--keepaliveMaxServerConnectionAge", "forever"])


def test_every_pilot_variable_meshpilot_reads_is_listed_as_implemented() -> None:
    read = set()
    for path in (ROOT / "src" / "meshpilot").rglob("*.py"):
        if "_proto" in path.parts or path.parts[-2] == "agent":  # the agent's are pilot-agent's
            continue
        text = path.read_text()
        read |= set(re.findall(r"(?:env_default|environ\.get|environ\[)\(?\s*\"([A-Z][A-Z0-9_]+)\"", text))
    listed = {k.name: k for k in ENV}
    istiods = {n for n in read if n.startswith(istiod_compat.FEATURE_PREFIXES) or n in listed}
    assert "PILOT_DEBOUNCE_AFTER" in istiods  # the scan finds what it should
    unlisted = sorted(n for n in istiods if n not in listed or listed[n].support is not Support.IMPLEMENTED)
    assert unlisted == []


@pytest.mark.reference
def test_the_table_has_every_variable_of_the_chart(istio_rendered: Callable[..., Objects]) -> None:
    chart_env = {e["name"] for e in istiod_deployment(istio_rendered)["env"]}
    assert chart_env <= {k.name for k in ENV}


# -- Started as the chart starts istiod --


def _env(container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet would give it (fields of a pod named istiod-0)."""
    fields = {
        "metadata.name": "istiod-0",
        "metadata.namespace": "istio-system",
        "spec.serviceAccountName": "istiod",
    }
    return container_env(container["env"], fields)


def _meshpilot(tmp_path: Path, args: list[str], env: dict[str, str]) -> tuple[Process, int]:
    config = tmp_path / "config"
    config.mkdir()
    http_port = free_port()
    argv = [
        sys.executable,
        "-m",
        "meshpilot.cli.main",
        *args,
        # Appended, so they win: a config directory instead of the cluster, and loopback ports of the
        # test's own instead of the chart's (:15014 and the others may be taken on this machine).
        # Nothing else: the server runs as the chart runs it, push workers by the chart's GOMAXPROCS.
        f"--configDir={config}",
        f"--grpcAddr={HOST}:{free_port()}",
        f"--secureGRPCAddr={HOST}:{free_port()}",
        f"--httpAddr={HOST}:{http_port}",
        f"--httpsAddr={HOST}:{free_port()}",
        f"--monitoringAddr={HOST}:{free_port()}",
    ]
    # The chart's environment only (no KUBERNETES_SERVICE_HOST: not in a pod).
    process = Process("meshpilot", argv, tmp_path / "meshpilot.log")
    process.env = {**{k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}, **env}
    return process, http_port


@pytest.mark.integration
@pytest.mark.reference
def test_meshpilot_starts_with_the_charts_command_line(
    istio_rendered: Callable[..., Objects], tmp_path: Path
) -> None:
    container = istiod_deployment(istio_rendered)
    # What the chart passes with its default values, among them the flags meshpilot refused before.
    assert "--log_output_level=default:info" in container["args"]
    assert "--keepaliveMaxServerConnectionAge" in container["args"]
    env = _env(container)
    process, http_port = _meshpilot(tmp_path, container["args"], env)
    process.start()
    try:

        def ready() -> bool:
            assert process.running, process.log()
            return http_get(HOST, http_port, "/ready")[0] == 200

        eventually(ready, timeout=30, what="meshpilot /ready")
        # Counted by name as well as logged: a dashboard shows what has no effect.
        # The test's own address is the last --monitoringAddr (appended after the chart's).
        monitoring = [a for a in process.argv if a.startswith("--monitoringAddr=")][-1]
        status, body, _ = http_get(HOST, int(monitoring.rsplit(":", 1)[1]), "/metrics")
        assert status == 200
        metrics = body.decode()
        unimplemented = re.findall(
            r'^meshpilot_unimplemented_settings\{name="([^"]+)"\} 1\.0$', metrics, re.M
        )
        assert unimplemented == ["CA_TRUSTED_NODE_ACCOUNTS"], metrics
    finally:
        process.stop()
    log = process.log()
    logged = re.findall(r"istiod setting (\S+?)=\S* accepted but not implemented", log)
    # Once; what the chart sets that meshpilot implements (GOMAXPROCS bounds its push workers) or that is
    # what it does anyway (--keepaliveMaxServerConnectionAge 30m, a KUBECONFIG that is not there,
    # REVISION=default, ...) not at all.
    assert logged == ["CA_TRUSTED_NODE_ACCOUNTS"], log
    assert "not known to meshpilot" not in log


def test_a_security_setting_meshpilot_cannot_honour_stops_it(tmp_path: Path) -> None:
    process, _ = _meshpilot(tmp_path, ["discovery"], {"COMPLIANCE_POLICY": "fips-140-3", "PILOT_FOO": "1"})
    process.start()
    assert process.proc is not None
    assert process.proc.wait(30) == 2
    log = process.log()
    assert "istiod setting COMPLIANCE_POLICY=fips-140-3 is refused" in log
    assert "istiod setting PILOT_FOO=1 not known to meshpilot" in log
