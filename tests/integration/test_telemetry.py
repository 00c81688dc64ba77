"""Access logs and tracing as meshpilot configures them, seen from a real upstream Envoy.

The client sidecar captures nothing; its egress listener is bound to ``CLIENT_IP:9080``, so a request
there with ``Host: api`` is routed as the application's would be. MeshConfig ``accessLogFile`` names a
file in the test's directory; a Telemetry object sends spans at 100% to a Zipkin collector the test
runs on loopback, reached through its Service's outbound cluster as istiod reaches it. Tracing and
access logs are upstream Envoy features: the Envoy must take every update (no NACK) and use them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from integration.conftest import MeshHarness
from support.kube import egress_sidecar, istio, workload
from support.processes import Envoy, free_port, http_get
from support.wait import eventually
from support.zipkin import ZipkinCollector

from meshpilot.networking.access_log import JSON_LABELS

pytestmark = [pytest.mark.envoy, pytest.mark.integration]

CLIENT_IP = "127.0.77.11"
API_IP = "127.0.77.52"
ZIPKIN_IP = "127.0.77.91"
PORT = 9080
API_CLUSTER = "outbound|9080||api.default.svc.cluster.local"

_ADDRESS = r"127\.\d+\.\d+\.\d+:\d+"
#: A request line of istiod's default text format, as Envoy fills it in for one request to api.
_TEXT_LINE = re.compile(
    r'^\[\d{4}-\d\d-\d\dT[0-9:.]+Z\] "GET /hello\?x=1 HTTP/1\.1" 200 - via_upstream - "-" 0 \d+ \d+ \d+ '
    rf'"-" "telemetry-test" "[0-9a-f-]{{36}}" "api" "{re.escape(API_IP)}:9080" {re.escape(API_CLUSTER)} '
    rf"{_ADDRESS} {re.escape(CLIENT_IP)}:9080 {_ADDRESS} - default$"
)


def _start(
    mesh: MeshHarness, mesh_config: dict[str, Any], *extra: dict[str, Any], istio_version: str = "1.28.0"
) -> Envoy:
    mesh.write("api.yaml", workload("api", "default", "10.96.0.50", PORT, {"api-1": API_IP}))
    mesh.write("istio.yaml", [egress_sidecar("client", CLIENT_IP), *extra])
    config = mesh.tmp / "mesh.yaml"
    config.write_text(yaml.safe_dump(mesh_config))
    mesh.backend("api-1", API_IP, PORT)
    mesh.start_meshpilot(mesh_config=config)
    envoy = mesh.sidecar(
        "client-1",
        CLIENT_IP,
        labels={"app": "client"},
        service_account="client",
        extra_metadata={"ISTIO_VERSION": istio_version},
    )
    eventually(lambda: _get("/ready")[0] == 200, timeout=30, what="route to api pushed")
    return envoy


def _get(path: str) -> tuple[int, dict[str, Any]]:
    status, body, _ = http_get(CLIENT_IP, PORT, path, {"Host": "api", "User-Agent": "telemetry-test"})
    return status, json.loads(body) if status == 200 else {}


def _lines(path: Path, needle: str) -> list[str]:
    if not path.exists():
        return []
    return [line for line in path.read_text().splitlines() if needle in line]


def _dynamic_listeners(envoy: Envoy) -> str:
    for config in envoy.config_dump()["configs"]:
        if config["@type"].endswith("ListenersConfigDump"):
            return json.dumps(config.get("dynamic_listeners", []))
    return ""


def test_access_log_file_and_zipkin_spans(mesh: MeshHarness) -> None:
    zipkin_port = free_port(ZIPKIN_IP)
    collector = ZipkinCollector(ZIPKIN_IP, zipkin_port).start()
    try:
        log_file = mesh.tmp / "access.log"
        mesh.write(
            "zipkin.yaml", workload("zipkin", "default", "10.96.0.90", zipkin_port, {"zipkin-1": ZIPKIN_IP})
        )
        telemetry = istio(
            "Telemetry",
            "mesh-default",
            "istio-system",
            {
                "tracing": [
                    {
                        "providers": [{"name": "zipkin"}],
                        "randomSamplingPercentage": 100,
                        "customTags": {"team": {"literal": {"value": "payments"}}},
                    }
                ]
            },
            group="telemetry",
        )
        mesh_config = {
            "accessLogFile": str(log_file),
            "extensionProviders": [
                {
                    "name": "zipkin",
                    "zipkin": {"service": "zipkin.default.svc.cluster.local", "port": zipkin_port},
                }
            ],
        }
        # A 1.31 proxy gets the collector as an HTTP service (with a timeout), as istiod sends it.
        envoy = _start(mesh, mesh_config, telemetry, istio_version="1.31.0")

        status, seen = _get("/hello?x=1")
        assert status == 200 and seen["name"] == "api-1"
        headers = {k.lower(): v for k, v in seen["headers"].items()}
        # Sampled at 100%: the trace context travels on to the application.
        assert headers["x-b3-sampled"] == "1"
        trace_id = headers["x-b3-traceid"]

        # (a) the request's line, in istiod's default text format, in the file MeshConfig names.
        lines = eventually(lambda: _lines(log_file, "/hello?x=1"), timeout=15, what="access log line")
        assert len(lines) == 1 and _TEXT_LINE.match(lines[0]), lines

        # (b) the client span reaches the collector through the zipkin Service's cluster.
        def span() -> dict[str, Any] | None:
            return next((s for s in collector.received() if s.get("traceId") == trace_id), None)

        found = eventually(span, timeout=20, what="span at the Zipkin collector")
        tags = found["tags"]
        assert tags["team"] == "payments"
        assert tags["istio.namespace"] == "default"
        assert tags["istio.cluster_id"] == "Kubernetes"
        assert {"istio.canonical_service", "istio.canonical_revision", "istio.mesh_id"} <= set(tags)
        assert tags["upstream_cluster"] == API_CLUSTER
        assert found["kind"] == "CLIENT"

        # (c) every update taken, with the tracer and the loggers in the listeners Envoy runs.
        assert envoy.rejected_updates() == {}
        listeners = _dynamic_listeners(envoy)
        assert "envoy.tracers.zipkin" in listeners and str(log_file) in listeners
        assert "http://zipkin.default.svc.cluster.local/api/v2/spans" in listeners
    finally:
        collector.stop()


def test_json_access_log(mesh: MeshHarness) -> None:
    log_file = mesh.tmp / "access.json"
    envoy = _start(mesh, {"accessLogFile": str(log_file), "accessLogEncoding": "JSON"})

    assert _get("/json-please")[0] == 200
    lines = eventually(lambda: _lines(log_file, "/json-please"), timeout=15, what="access log line")
    assert len(lines) == 1
    entry = json.loads(lines[0])
    # istiod's default labels, each filled in by Envoy.
    assert set(entry) == set(JSON_LABELS)
    assert entry["method"] == "GET"
    assert entry["path"] == "/json-please"
    assert entry["response_code"] == 200
    assert entry["upstream_cluster"] == API_CLUSTER
    assert entry["authority"] == "api"
    assert entry["user_agent"] == "telemetry-test"
    assert envoy.rejected_updates() == {}
