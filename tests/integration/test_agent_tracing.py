"""Legacy tracing end to end: MeshConfig ``enableTracing`` and ``defaultConfig.tracing.zipkin``, with the
tracer written by ``meshpilot agent`` into its Envoy's bootstrap, as pilot-agent writes it.

One MeshConfig file is read by both meshpilot (which gives the HCMs sampling and istiod's tags, but no
tracer) and the agent (its ``--meshConfig`` file, whose ``defaultConfig`` it merges into the ProxyConfig,
as pilot-agent does with the mesh ConfigMap mounted). A request through the agent-run sidecar must
reach a Zipkin collector on loopback as a span carrying istiod's tags: the spans can only come from the
bootstrap's tracer, since the listeners meshpilot sends name none.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from integration.conftest import ca, mesh  # noqa: F401  (the integration fixtures)
from support.agent_harness import (
    MESHPILOT_AGENT,
    POD_IP,
    REVIEWS,
    SERVICE_PORT,
    prepare_agent,
    start_mesh,
    wait_ready,
)
from support.processes import free_port, http_get
from support.wait import eventually
from support.zipkin import ZipkinCollector

pytestmark = [pytest.mark.envoy, pytest.mark.integration]

ZIPKIN_IP = "127.0.61.91"
REVIEWS_CLUSTER = f"outbound|{SERVICE_PORT}||{REVIEWS}"


def _dynamic_listeners(dump: dict[str, Any]) -> str:
    for config in dump["configs"]:
        if config["@type"].endswith("ListenersConfigDump"):
            return json.dumps(config.get("dynamic_listeners", []))
    return ""


def _bootstrap(dump: dict[str, Any]) -> dict[str, Any]:
    for config in dump["configs"]:
        if config["@type"].endswith("BootstrapConfigDump"):
            return dict(config["bootstrap"])
    raise AssertionError("no bootstrap in the config dump")


def test_zipkin_from_default_config_gets_spans_with_istio_tags(mesh, ca) -> None:  # noqa: F811
    collector = ZipkinCollector(ZIPKIN_IP, free_port(ZIPKIN_IP)).start()
    try:
        mesh_config = {
            "enableTracing": True,
            "defaultConfig": {
                "tracing": {"zipkin": {"address": f"{ZIPKIN_IP}:{collector.port}"}, "sampling": 100},
            },
        }
        mesh_file = mesh.tmp / "mesh.yaml"
        mesh_file.write_text(yaml.safe_dump(mesh_config))
        start_mesh(mesh, mesh_config=mesh_file)
        inputs = prepare_agent(mesh, ca, proxy_config={"controlPlaneAuthPolicy": "NONE"}, mounted_certs=True)
        # Where the agent's --meshConfig flag looks by default.
        (inputs.root / "etc/istio/config").mkdir(parents=True, exist_ok=True)
        (inputs.root / "etc/istio/config/mesh").write_text(mesh_file.read_text())
        agent = inputs.launch(mesh, MESHPILOT_AGENT, "meshpilot-agent")
        wait_ready(agent)
        envoy = agent.envoy()

        def request() -> dict[str, Any] | None:
            status, body, _ = http_get(POD_IP, SERVICE_PORT, "/traced", {"Host": "reviews"})
            return dict(json.loads(body)) if status == 200 else None

        seen = eventually(request, timeout=15, what="a request through the agent's Envoy")
        assert seen["name"] == "reviews-v1"
        headers = {k.lower(): v for k, v in seen["headers"].items()}
        # Sampled at defaultConfig's 100%: the B3 context travels on to the application.
        assert headers["x-b3-sampled"] == "1"
        trace_id = headers["x-b3-traceid"]

        def span() -> dict[str, Any] | None:
            return next((s for s in collector.received() if s.get("traceId") == trace_id), None)

        found = eventually(span, timeout=20, what="the request's span at the Zipkin collector")
        assert found["kind"] == "CLIENT"
        tags = found["tags"]
        assert tags["istio.canonical_service"] == "productpage"
        assert tags["istio.canonical_revision"] == "v1"
        assert tags["istio.namespace"] == "default"
        assert tags["upstream_cluster"] == REVIEWS_CLUSTER
        assert found["localEndpoint"]["serviceName"] == "productpage.default"

        # The tracer is the bootstrap's: meshpilot's listeners trace without naming one.
        dump = envoy.config_dump()
        tracer = _bootstrap(dump)["tracing"]["http"]
        assert tracer["name"] == "envoy.tracers.zipkin"
        assert tracer["typed_config"]["collector_cluster"] == "zipkin"
        listeners = _dynamic_listeners(dump)
        assert '"tracing"' in listeners and "envoy.tracers.zipkin" not in listeners
        assert envoy.rejected_updates() == {}
    finally:
        collector.stop()
