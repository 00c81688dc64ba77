"""The bootstrap ``meshpilot agent`` writes, against the one Istio's pilot-agent writes for the same pod.

The reference case runs both agents on exactly the same inputs (one injected productpage pod: the same
root directory, arguments, environment and ports, one after the other) and compares their
``etc/istio/proxy/envoy-rev.json`` leaf by leaf. They must agree except for :data:`KNOWN_DIFFERENCES`,
each with its reason; a new difference, or a listed one that went away, fails.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from integration.conftest import ca, mesh  # noqa: F401  (the integration fixtures)
from support import reference
from support.agent_harness import MESHPILOT_AGENT, POD_IP, PilotAgent, prepare_agent, start_mesh, wait_ready

from meshpilot.agent.bootstrap import build_bootstrap, write_bootstrap
from meshpilot.agent.settings import Flags, load_settings

#: Leaves (JSON paths) where meshpilot's bootstrap differs from pilot-agent's, and why.
KNOWN_DIFFERENCES = {
    "node.metadata.INSTANCE_IPS": "pilot-agent appends the machine's other private addresses after the pod "
    "IP; meshpilot sends INSTANCE_IP alone (Python's standard library cannot list interface addresses). "
    "In a pod the pod IP is the only private address, so the two agree there.",
}


def _leaves(value: Any, path: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_leaves(item, f"{path}.{key}" if path else str(key)))
        return out or {path: {}}
    if isinstance(value, list):
        out = {}
        for i, item in enumerate(value):
            out.update(_leaves(item, f"{path}[{i}]"))
        return out or {path: []}
    return {path: value}


def differences(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Leaf paths whose values differ (a missing leaf is ``<absent>``)."""
    a, b = _leaves(ours), _leaves(theirs)
    return {
        p: (a.get(p, "<absent>"), b.get(p, "<absent>"))
        for p in sorted(a.keys() | b.keys())
        if a.get(p, "<absent>") != b.get(p, "<absent>")
    }


def _capture(agent: PilotAgent) -> dict[str, Any]:
    wait_ready(agent)
    bootstrap = agent.bootstrap()
    assert agent.stop(timeout=15) is not None
    return bootstrap


#: The agent's root in the reference case (``prepare_agent``'s default), for the files TLS settings name.
AGENT_ROOT = "agent-root"
CREDENTIALS = "var/run/secrets/workload-spiffe-credentials"
#: Legacy ``tracing`` sections each agent turns into a bootstrap tracer; ``{root}`` is the agent's root.
TRACING_CASES: dict[str, dict[str, Any]] = {
    "no-tracer": {},
    "zipkin": {
        "zipkin": {"address": "127.0.0.1:9411"},
        "sampling": 100,
        "customTags": {"team": {"literal": {"value": "payments"}}},
    },
    "zipkin-simple-tls": {
        "zipkin": {"address": "localhost:9411"},
        "tlsSettings": {
            "mode": "SIMPLE",
            "caCertificates": "{root}/var/run/secrets/istio/root-cert.pem",
            "sni": "zipkin.example.com",
            "subjectAltNames": ["zipkin.example.com", "collector.example.com"],
        },
    },
    "zipkin-mutual-tls": {
        "zipkin": {"address": "127.0.0.1:9411"},
        "tlsSettings": {
            "mode": "MUTUAL",
            "caCertificates": f"{{root}}/{CREDENTIALS}/root-cert.pem",
            "clientCertificate": f"{{root}}/{CREDENTIALS}/cert-chain.pem",
            "privateKey": f"{{root}}/{CREDENTIALS}/key.pem",
        },
    },
    "zipkin-istio-mutual": {"zipkin": {"address": "127.0.0.1:9411"}, "tlsSettings": {"mode": "ISTIO_MUTUAL"}},
    "datadog-host-ip": {"datadog": {"address": "$(HOST_IP):8126"}},
}


@pytest.mark.integration
@pytest.mark.envoy
@pytest.mark.reference
@pytest.mark.parametrize("case", list(TRACING_CASES))
def test_bootstrap_matches_pilot_agent(mesh, ca, case: str) -> None:  # noqa: F811
    """Both agents on the same pod, with no tracer or with the legacy ``tracing`` section of ``case``:
    pilot-agent is the referee for the tracer and its collector cluster too."""
    binary = reference.binary("pilot-agent")
    template = reference.istio_file("tools/packaging/common/envoy_bootstrap.json")
    start_mesh(mesh)
    tracing = json.loads(json.dumps(TRACING_CASES[case]).replace("{root}", str(mesh.tmp / AGENT_ROOT)))
    inputs = prepare_agent(
        mesh,
        ca,
        template=template,
        proxy_config={"controlPlaneAuthPolicy": "NONE", **({"tracing": tracing} if tracing else {})},
        mounted_certs=True,
        extra_env={"ISTIO_DELTA_XDS": "false"},
        root_name=AGENT_ROOT,
    )
    theirs = _capture(inputs.launch(mesh, [str(binary)], "pilot-agent"))
    ours = _capture(inputs.launch(mesh, MESHPILOT_AGENT, "meshpilot-agent"))
    found = differences(ours, theirs)
    assert found.keys() == KNOWN_DIFFERENCES.keys(), json.dumps(found, indent=1, default=str)
    assert ours["node"]["metadata"]["INSTANCE_IPS"] == POD_IP
    # The comparison saw a tracer exactly when the case has one.
    assert ("tracing" in theirs) == bool(tracing)


# Unit tests: the bootstrap built in-process from a laid-out root.


def _root(tmp_path: Path, annotations: str = "", labels: str = "") -> Path:
    podinfo = tmp_path / "etc/istio/pod"
    podinfo.mkdir(parents=True)
    (podinfo / "labels").write_text(labels)
    (podinfo / "annotations").write_text(annotations)
    return tmp_path


ENV = {
    "POD_NAME": "web-1",
    "POD_NAMESPACE": "shop",
    "INSTANCE_IP": "10.1.2.3",
    "SERVICE_ACCOUNT": "web",
    "ISTIO_META_CLUSTER_ID": "Kubernetes",
    "PROXY_CONFIG": '{"proxyAdminPort": 16000, "statusPort": 16020}',
}


def test_delta_is_the_default_and_can_be_turned_off(tmp_path: Path) -> None:
    root = _root(tmp_path)
    on = build_bootstrap(load_settings(Flags(), ENV, root))
    off = build_bootstrap(load_settings(Flags(), {**ENV, "ISTIO_DELTA_XDS": "false"}, root))
    assert on["dynamic_resources"]["ads_config"]["api_type"] == "DELTA_GRPC"
    assert off["dynamic_resources"]["ads_config"]["api_type"] == "GRPC"


def test_clusters_listeners_and_node(tmp_path: Path) -> None:
    root = _root(tmp_path, labels='app="web"\npod-template-hash="abc"\n')
    settings = load_settings(Flags(), {**ENV, "ENVOY_STATUS_PORT": "17021"}, root)
    bootstrap = build_bootstrap(settings)
    node = bootstrap["node"]
    assert node["id"] == "sidecar~10.1.2.3~web-1.shop~shop.svc.cluster.local"
    assert node["cluster"] == "web.shop"
    assert node["metadata"]["LABELS"] == {"app": "web"}
    assert node["metadata"]["PILOT_SAN"] == ["istiod.istio-system.svc"]
    clusters = {c["name"]: c for c in bootstrap["static_resources"]["clusters"]}
    assert list(clusters) == ["prometheus_stats", "agent", "sds-grpc", "xds-grpc"]

    def address(name: str) -> dict[str, Any]:
        endpoint = clusters[name]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
        return dict(endpoint["address"])

    assert address("xds-grpc") == {"pipe": {"path": "./etc/istio/proxy/XDS"}}
    assert address("sds-grpc") == {"pipe": {"path": "./var/run/secrets/workload-spiffe-uds/socket"}}
    assert address("agent")["socket_address"]["port_value"] == 16020
    assert [listener["name"] for listener in bootstrap["static_resources"]["listeners"]] == [
        "0.0.0.0_15090",
        "0.0.0.0_17021",
    ]
    assert bootstrap["admin"]["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 16000}
    assert "tracing" not in bootstrap


def test_written_where_envoy_is_told(tmp_path: Path) -> None:
    settings = load_settings(Flags(), ENV, _root(tmp_path))
    relative = write_bootstrap(settings)
    assert relative == Path("etc/istio/proxy/envoy-rev.json")
    assert json.loads((tmp_path / relative).read_text())["node"]["id"].startswith("sidecar~10.1.2.3~")
