"""The agent's inputs: flags, environment, podinfo files, ProxyConfig layers, node identity and metadata;
Envoy's command line; the status server's pieces."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from meshpilot.agent.envoy import EnvoyOptions, envoy_args, split_log_level
from meshpilot.agent.run import AgentError, xds_root
from meshpilot.agent.settings import (
    Flags,
    SettingsError,
    load_settings,
    node_metadata,
    parse_downward_api,
    parse_duration,
    service_cluster,
)
from meshpilot.agent.status import StatusOptions, StatusServer, parse_stats
from meshpilot.cli.main import build_parser

ENV = {
    "POD_NAME": "web-1",
    "POD_NAMESPACE": "shop",
    "INSTANCE_IP": "10.1.2.3",
    "SERVICE_ACCOUNT": "web",
    "ISTIO_META_CLUSTER_ID": "Kubernetes",
}


def _root(
    tmp_path: Path, annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None
) -> Path:
    podinfo = tmp_path / "etc/istio/pod"
    podinfo.mkdir(parents=True)
    for name, values in (("annotations", annotations or {}), ("labels", labels or {})):
        (podinfo / name).write_text("".join(f"{k}={json.dumps(v)}\n" for k, v in values.items()))
    return tmp_path


def test_injected_arguments_parse() -> None:
    args = build_parser().parse_args(
        [
            "agent",
            "proxy",
            "sidecar",
            "--domain",
            "shop.svc.cluster.local",
            "--proxyLogLevel=warning",
            "--proxyComponentLogLevel=misc:error",
            "--log_output_level=default:info",
        ]
    )
    assert (args.type, args.domain, args.proxyLogLevel, args.proxyComponentLogLevel) == (
        "sidecar",
        "shop.svc.cluster.local",
        "warning",
        "misc:error",
    )
    sds = ["agent", "sds", "--address", "unix:///x", "--cert-chain", "a", "--key", "b", "--root-cert", "c"]
    assert build_parser().parse_args(sds).agent_command == "sds"


def test_proxy_config_layers_in_pilot_agents_order(tmp_path: Path) -> None:
    mesh = tmp_path / "etc/istio/config/mesh"
    mesh.parent.mkdir(parents=True)
    mesh.write_text(
        "defaultConfig:\n  statusPort: 1\n  drainDuration: 10s\n  proxyMetadata: {A: mesh, B: mesh}\n"
    )
    root = _root(tmp_path, {"proxy.istio.io/config": "proxyAdminPort: 3\nproxyMetadata: {B: annotation}\n"})
    env = {**ENV, "PROXY_CONFIG": '{"statusPort": 2, "proxyAdminPort": 2}'}
    settings = load_settings(Flags(), env, root)
    config = settings.proxy_config
    assert (config["statusPort"], config["proxyAdminPort"], config["drainDuration"]) == (2, 3, "10s")
    assert config["proxyMetadata"] == {"A": "mesh", "B": "annotation"}
    assert config["discoveryAddress"] == "istiod.istio-system.svc:15012"
    assert settings.mutual_tls and settings.termination_drain_duration == 5.0


def test_status_port_and_discovery_annotations_win(tmp_path: Path) -> None:
    root = _root(
        tmp_path, {"status.sidecar.istio.io/port": "1234", "sidecar.istio.io/discoveryAddress": "x:1"}
    )
    settings = load_settings(Flags(), {**ENV, "PROXY_CONFIG": "statusPort: 99"}, root)
    assert (settings.status_port, settings.discovery_address, settings.ca_address) == (1234, "x:1", "x:1")


def test_node_identity_and_metadata(tmp_path: Path) -> None:
    root = _root(tmp_path, {"a": "b"}, {"app": "web", "pod-template-hash": "h", "istio-locality": "r1.z1"})
    env = {
        **ENV,
        "ISTIO_META_POD_PORTS": '[\n {"name":"http","containerPort":80}\n]',
        "ISTIO_META_DNS_CAPTURE": "true",
        "ISTIO_META_NETWORK": "",
        "ISTIO_METAJSON_EXTRA": '{"X": "y"}',
        "PROXY_CONFIG": '{"controlPlaneAuthPolicy": "NONE", "concurrency": 2}',
        "ENVOY_STATUS_PORT": "17021",
    }
    settings = load_settings(Flags(domain="shop.svc.example"), env, root)
    assert settings.node_id == "sidecar~10.1.2.3~web-1.shop~shop.svc.example"
    metadata = node_metadata(settings)
    assert metadata["POD_PORTS"] == '[{"name":"http","containerPort":80,"protocol":""}]'
    assert metadata["DNS_CAPTURE"] == "true" and "NETWORK" not in metadata and metadata["X"] == "y"
    assert metadata["LABELS"] == {"app": "web", "istio-locality": "r1/z1"}
    assert metadata["ANNOTATIONS"] == {"a": "b"}
    assert (metadata["ENVOY_STATUS_PORT"], metadata["ENVOY_PROMETHEUS_PORT"]) == (17021, 15090)
    assert metadata["PROXY_CONFIG"]["concurrency"] == 2
    assert "controlPlaneAuthPolicy" not in metadata["PROXY_CONFIG"] and "PILOT_SAN" not in metadata
    assert (metadata["NAME"], metadata["NAMESPACE"], metadata["SERVICE_ACCOUNT"]) == ("web-1", "shop", "web")
    assert metadata["ISTIO_VERSION"] == "1.31-dev" and metadata["METADATA_DISCOVERY"] == "false"
    assert service_cluster(settings, metadata) == "web.shop"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"INSTANCE_IP": "nope"}, "INSTANCE_IP"),
        ({"PROXY_CONFIG": "[1]"}, "not a mapping"),
        ({"PROXY_CONFIG": "drainDuration: soon"}, "duration"),
        ({"ISTIO_DELTA_XDS": "maybe"}, "ISTIO_DELTA_XDS"),
        ({"ISTIO_KUBE_APP_PROBERS": "{"}, "ISTIO_KUBE_APP_PROBERS"),
    ],
)
def test_bad_inputs_are_named(tmp_path: Path, env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        load_settings(Flags(), {**ENV, **env}, _root(tmp_path))


def test_small_parsers() -> None:
    assert parse_duration("1m30s") == 90.0 and parse_duration("0.5s") == 0.5
    assert parse_downward_api('a="x=\\"y\\""\nbroken\n') == {"a": 'x="y"'}
    assert split_log_level("info,misc:error,bad:x:y") == ("info", ["misc:error"])
    assert parse_stats("server.state: 0\nlistener_manager.workers_started: 1\nx: hist") == {
        "server.state": 0,
        "listener_manager.workers_started": 1,
    }


def test_envoy_command_line_is_pilot_agents() -> None:
    options = EnvoyOptions(
        binary="envoy", config_file=Path("etc/istio/proxy/envoy-rev.json"), cwd=Path("."), admin_port=1,
        concurrency=1, component_log_level="misc:error",
    )  # fmt: skip
    expected = (
        "envoy -c etc/istio/proxy/envoy-rev.json --drain-time-s 45 --drain-strategy immediate "
        "--local-address-ip-version v4 --file-flush-interval-msec 1000 --disable-hot-restart "
        "--allow-unknown-static-fields -l warning --component-log-level misc:error "
        "--skip-deprecated-logs --concurrency 1"
    )
    assert envoy_args(options) == expected.split(" ")


def test_istiod_root_is_required_with_mutual_tls(tmp_path: Path) -> None:
    settings = load_settings(Flags(), ENV, _root(tmp_path))
    with pytest.raises(AgentError, match="no root certificate"):
        xds_root(settings)
    (tmp_path / "var/run/secrets/istio").mkdir(parents=True)
    (tmp_path / "var/run/secrets/istio/root-cert.pem").write_bytes(b"ROOT")
    assert xds_root(settings) == b"ROOT"


def test_command_exits_non_zero_without_a_root(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "meshpilot.cli.main", "agent", "proxy", "sidecar"],
        cwd=_root(tmp_path),
        env={**ENV, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "no root certificate to verify istiod" in done.stderr


async def test_app_probes(unused_tcp_port_factory: Any) -> None:
    app_port, closed_port, status_port = (unused_tcp_port_factory() for _ in range(3))

    async def ready(request: web.Request) -> web.Response:
        return web.Response(status=200 if request.headers.get("X-Probe") == "yes" else 418, text="app")

    app = web.Application()
    app.router.add_get("/ready", ready)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", app_port).start()
    probers = {
        "/app-health/web/readyz": {
            "httpGet": {
                "path": "/ready",
                "port": app_port,
                "httpHeaders": [{"name": "X-Probe", "value": "yes"}],
            }
        },
        "/app-health/web/livez": {"tcpSocket": {"port": app_port}},
        "/app-health/web/startupz": {"tcpSocket": {"port": closed_port}, "timeoutSeconds": 1},
    }
    options = StatusOptions(status_port, 1, 1, probers, probe_host="127.0.0.1", host="127.0.0.1")
    try:
        async with StatusServer(options), aiohttp.ClientSession() as session:
            base = f"http://127.0.0.1:{status_port}"
            codes = {}
            for path in (*probers, "/app-health/web/other", "/healthz/ready"):
                async with session.get(base + path) as response:
                    codes[path] = response.status
            assert codes == {
                "/app-health/web/readyz": 200,
                "/app-health/web/livez": 200,
                "/app-health/web/startupz": 500,
                "/app-health/web/other": 404,
                "/healthz/ready": 503,  # no Envoy on admin port 1
            }
    finally:
        await runner.cleanup()
        await asyncio.sleep(0)
