"""Ingress gateways run by agents, terminating HTTPS with certificates from Kubernetes Secrets.

Two gateway pods of ``istio-system`` (service account ``istio-ingressgateway``, as Istio's gateway chart
deploys them), each an Envoy started by an agent in router mode (``proxy router``) with its pod's token
against meshpilot's secure port, its workload certificate from meshpilot's CA:

- ``gw-meshpilot``, run by ``meshpilot agent``;
- ``gw-istio``, run by Istio's real pilot-agent (``build/reference/bin``) with Istio's bootstrap template.

Each has a Gateway of its own (selected by a label of its pod, bound to its pod address): a SIMPLE
server for ``bookinfo.example.com`` with Secret ``bookinfo-cert``, and a MUTUAL one for
``secure.example.com`` with Secret ``secure-cert``, whose ``ca.crt`` is the client CA. One VirtualService
routes both hosts of both gateways to ``productpage``, a loopback app outside the mesh.

The Secrets live in a real kube-apiserver, whose RBAC decides who may have their keys: meshpilot serves
a Secret's key over SDS (on the gateway's ADS stream, through its agent) only to a proxy whose service
account may list Secrets in its namespace, which it asks with a SubjectAccessReview. The gateways'
account is granted that by the Role and RoleBinding of Istio's gateway chart; another account of the
namespace, granted nothing, gets the CA alone. Rotating a Secret through the API reaches both gateways
without a restart.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from integration.conftest import MeshHarness
from support import reference
from support.ads_client import AdsClient, Secure
from support.agent_harness import (
    MESHPILOT_AGENT,
    MeshWorkload,
    PilotAgent,
    SecureControlPlane,
    start_workload_agent,
    wait_ready,
)
from support.gateway_tls import REFUSED, Pair, attempt, certificate, https_get, tls_secret, write_pair
from support.kube import endpoint_slice, istio, namespace, pod, service
from support.processes import Meshpilot, free_port
from support.real_kube import RealKubeApiServer, service_account_token
from support.wait import eventually

if TYPE_CHECKING:
    from support.certs import TestCA

pytestmark = [pytest.mark.integration, pytest.mark.envoy, pytest.mark.reference, pytest.mark.timeout(300)]

ACCOUNT = "istio-ingressgateway"
BACKEND_IP = "127.0.65.21"
SIMPLE_HOST = "bookinfo.example.com"
MUTUAL_HOST = "secure.example.com"
SECRET_TYPE = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"


#: The gateway pods (name, address), by the agent that runs each; their ports are chosen per run.
GATEWAY_PODS = {
    "meshpilot-agent": ("gw-meshpilot", "127.0.65.11"),
    "pilot-agent": ("gw-istio", "127.0.65.12"),
}


@dataclass(frozen=True)
class GatewayPod:
    """A gateway pod, the agent that runs it and the ports its Gateway's servers bind on its address."""

    workload: MeshWorkload
    agent: str
    simple_port: int
    mutual_port: int

    @property
    def ip(self) -> str:
        return self.workload.ip

    @property
    def gateway(self) -> str:
        return self.workload.pod


def gateway_pod(agent: str) -> GatewayPod:
    name, ip = GATEWAY_PODS[agent]
    labels = {"istio": "ingressgateway", "app": "istio-ingressgateway", "gateway": name}
    workload = MeshWorkload(name, ip, ACCOUNT, labels, namespace="istio-system")
    return GatewayPod(workload, agent, free_port(ip), free_port(ip))


# -- the cluster ------------------------------------------------------------------------------


def gateway_rbac() -> list[dict[str, Any]]:
    """What Istio's gateway chart grants its service account (``templates/role.yaml``): the Secrets of its
    namespace, which istiod checks before it sends a key."""
    meta = {"name": ACCOUNT, "namespace": "istio-system"}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta,
            "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "watch", "list"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ACCOUNT},
            "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": "istio-system"}],
        },
    ]


def gateway(gw: GatewayPod) -> dict[str, Any]:
    return istio(
        "Gateway",
        gw.gateway,
        "istio-system",
        {
            "selector": {"gateway": gw.gateway},
            "servers": [
                {
                    "port": {"number": gw.simple_port, "name": "https", "protocol": "HTTPS"},
                    "hosts": [SIMPLE_HOST],
                    "bind": gw.ip,
                    "tls": {"mode": "SIMPLE", "credentialName": "bookinfo-cert"},
                },
                {
                    "port": {"number": gw.mutual_port, "name": "https-mutual", "protocol": "HTTPS"},
                    "hosts": [MUTUAL_HOST],
                    "bind": gw.ip,
                    "tls": {"mode": "MUTUAL", "credentialName": "secure-cert"},
                },
            ],
        },
    )


def mesh_config(backend_port: int, gateways: list[GatewayPod]) -> list[dict[str, Any]]:
    ports = [("http", backend_port)]
    docs: list[dict[str, Any]] = [
        service("productpage", "default", "10.96.65.10", ports, {"app": "productpage"}),
        pod("productpage-v1", "default", BACKEND_IP, {"app": "productpage"}, "productpage"),
        endpoint_slice("productpage-s", "default", "productpage", ports, [("productpage-v1", BACKEND_IP)]),
        istio(
            "VirtualService",
            "bookinfo",
            "istio-system",
            {
                "hosts": [SIMPLE_HOST, MUTUAL_HOST],
                "gateways": [gw.gateway for gw in gateways],
                "http": [{"route": [{"destination": {"host": "productpage.default.svc.cluster.local"}}]}],
            },
        ),
    ]
    for gw in gateways:
        docs += [pod(gw.gateway, "istio-system", gw.ip, gw.workload.labels, ACCOUNT), gateway(gw)]
    return docs


@dataclass
class Certificates:
    """The Secrets' certificates, and client certificates for the MUTUAL server."""

    server: Pair
    mutual: Pair
    client_ca: Pair
    #: Signed by the client CA.
    client: tuple[Path, Path]
    #: Self-signed: a certificate the MUTUAL server must not accept.
    stranger: tuple[Path, Path]

    def secrets(self) -> list[dict[str, Any]]:
        return [
            tls_secret("bookinfo-cert", self.server),
            tls_secret("secure-cert", self.mutual, self.client_ca[0]),
        ]


@dataclass
class GatewayMesh:
    harness: MeshHarness
    kube: RealKubeApiServer
    certs: Certificates
    #: By the name of the agent that runs each.
    gateways: dict[str, GatewayPod]
    agents: dict[str, PilotAgent]
    root_pem: bytes

    def agent(self, gw: GatewayPod) -> PilotAgent:
        return self.agents[gw.agent]

    @property
    def meshpilot(self) -> Meshpilot:
        assert self.harness.meshpilot is not None
        return self.harness.meshpilot


@pytest.fixture(scope="module")
def gateway_mesh(tmp_path_factory: pytest.TempPathFactory, ca: TestCA) -> Iterator[GatewayMesh]:
    tmp = tmp_path_factory.mktemp("gateway-agent")
    client_ca = certificate(["client-ca"], ca=True)
    certs = Certificates(
        server=certificate([SIMPLE_HOST]),
        mutual=certificate([MUTUAL_HOST]),
        client_ca=client_ca,
        client=write_pair(tmp / "clients", "client", certificate(["client.example.com"], issuer=client_ca)),
        stranger=write_pair(tmp / "clients", "stranger", certificate(["stranger.example.com"])),
    )
    with RealKubeApiServer(tmp / "kube") as kube:
        for doc in [namespace("istio-system"), namespace("default"), *gateway_rbac(), *certs.secrets()]:
            kube.apply(doc)
        (tmp / "mesh").mkdir()
        harness = MeshHarness(tmp / "mesh", ca)
        try:
            backend_port = free_port(BACKEND_IP)
            harness.backend("productpage-v1", BACKEND_IP, backend_port)
            gateways = {agent: gateway_pod(agent) for agent in GATEWAY_PODS}
            harness.write("mesh.yaml", mesh_config(backend_port, list(gateways.values())))
            harness.start_meshpilot(kubeconfig=kube.write_kubeconfig(harness.tmp / "kubeconfig"))
            published = eventually(
                lambda: kube.get("configmaps", "istio-system", "istio-ca-root-cert"),
                what="the mesh root published",
            )
            root = str(published["data"]["root-cert.pem"]).encode()
            secure = SecureControlPlane(root, service_account_token(kube, ACCOUNT, "istio-system"))
            # Envoy's SDS counters (``sds.<secret>.update_success``) are not in Istio's default stats.
            stats = {"proxyStatsMatcher": {"inclusionPrefixes": ["sds."]}}
            meshpilot_gw, istio_gw = gateways["meshpilot-agent"], gateways["pilot-agent"]
            agents = {
                meshpilot_gw.agent: start_workload_agent(
                    harness,
                    MESHPILOT_AGENT,
                    meshpilot_gw.workload,
                    secure,
                    proxy_config=stats,
                    name=meshpilot_gw.agent,
                    node_type="router",
                ),
                istio_gw.agent: start_workload_agent(
                    harness,
                    [str(reference.binary("pilot-agent"))],
                    istio_gw.workload,
                    secure,
                    template=reference.istio_file("tools/packaging/common/envoy_bootstrap.json"),
                    proxy_config=stats,
                    name=istio_gw.agent,
                    node_type="router",
                ),
            }
            for agent in agents.values():
                wait_ready(agent)
            yield GatewayMesh(harness, kube, certs, gateways, agents, root)
        finally:
            harness.close()


@pytest.fixture(autouse=True)
def _logs_on_failure(request: pytest.FixtureRequest, gateway_mesh: GatewayMesh) -> Iterator[None]:
    """The processes' logs, printed at the end of a test that failed."""
    failed = request.session.testsfailed
    yield
    if request.session.testsfailed > failed:
        print(gateway_mesh.harness.logs())


# -- traffic ----------------------------------------------------------------------------------


def serves(gw: GatewayPod, port: int, sni: str, client: tuple[Path, Path] | None = None) -> Any:
    """(status, backend, serial of the gateway's certificate) of an HTTPS call, or None if refused."""
    return attempt(lambda: https_get(gw.ip, port, sni, client))


def envoy_pid(agent: PilotAgent) -> int:
    """The pid of the Envoy the agent runs (in the agent's process group)."""
    assert agent.proc is not None
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (
                os.getpgid(int(entry.name)) == agent.proc.pid
                and (entry / "comm").read_text().strip() == "envoy"
            ):
                found.append(int(entry.name))
        except (OSError, ProcessLookupError):
            continue
    assert len(found) == 1, found
    return found[0]


def sds_updates(agent: PilotAgent, secret: str) -> int:
    """Envoy's count of accepted updates of ``kubernetes://<secret>``."""
    return int(agent.envoy().stats().get(f"sds.kubernetes_{secret}.update_success", 0))


@pytest.mark.parametrize("agent", GATEWAY_PODS)
def test_a_simple_server_terminates_https_with_the_certificate_of_its_secret(
    gateway_mesh: GatewayMesh, agent: str
) -> None:
    gw = gateway_mesh.gateways[agent]
    server = gateway_mesh.certs.server[0]
    eventually(
        lambda: serves(gw, gw.simple_port, SIMPLE_HOST) == (200, "productpage-v1", server.serial_number),
        timeout=20,
        what=f"HTTPS at {gw.gateway} with the certificate of Secret bookinfo-cert",
    )
    # The key came over SDS on the gateway's ADS stream, through its agent, from meshpilot.
    assert sds_updates(gateway_mesh.agent(gw), "bookinfo-cert") >= 1
    assert gateway_mesh.agent(gw).envoy().rejected_updates() == {}


@pytest.mark.parametrize("agent", GATEWAY_PODS)
def test_a_mutual_server_refuses_a_client_without_a_certificate_of_its_ca(
    gateway_mesh: GatewayMesh, agent: str
) -> None:
    gw = gateway_mesh.gateways[agent]
    certs = gateway_mesh.certs
    eventually(
        lambda: (
            serves(gw, gw.mutual_port, MUTUAL_HOST, certs.client)
            == (200, "productpage-v1", certs.mutual[0].serial_number)
        ),
        timeout=20,
        what=f"mutual TLS at {gw.gateway} with a client certificate of the Secret's CA",
    )
    with pytest.raises(REFUSED):
        https_get(gw.ip, gw.mutual_port, MUTUAL_HOST)
    with pytest.raises(REFUSED):
        https_get(gw.ip, gw.mutual_port, MUTUAL_HOST, certs.stranger)
    # The client CA is the Secret's ca.crt, served as its own resource.
    assert sds_updates(gateway_mesh.agent(gw), "secure-cert-cacert") >= 1
    assert gateway_mesh.agent(gw).envoy().rejected_updates() == {}


def test_rotating_a_secret_reaches_the_gateways_without_a_restart(gateway_mesh: GatewayMesh) -> None:
    certs = gateway_mesh.certs
    for gw in gateway_mesh.gateways.values():
        eventually(
            lambda gw=gw: (
                serves(gw, gw.simple_port, SIMPLE_HOST)
                == (200, "productpage-v1", certs.server[0].serial_number)
            ),
            timeout=20,
            what=f"{gw.gateway} serving the first certificate",
        )
    before = {
        gw.gateway: (envoy_pid(gateway_mesh.agent(gw)), gateway_mesh.agent(gw).envoy().stats())
        for gw in gateway_mesh.gateways.values()
    }
    errors = gateway_mesh.meshpilot.metric("pilot_sds_certificate_errors_total")
    certs.server = certificate([SIMPLE_HOST])
    gateway_mesh.kube.apply(tls_secret("bookinfo-cert", certs.server))
    for gw in gateway_mesh.gateways.values():
        eventually(
            lambda gw=gw: (
                serves(gw, gw.simple_port, SIMPLE_HOST)
                == (200, "productpage-v1", certs.server[0].serial_number)
            ),
            timeout=20,
            what=f"{gw.gateway} serving the rotated certificate",
        )
    for gw in gateway_mesh.gateways.values():
        agent = gateway_mesh.agent(gw)
        pid, stats = before[gw.gateway]
        after = agent.envoy().stats()
        # The same Envoy, which took the new key as an update of the Secret it watches and kept its
        # listeners (none modified, so no connection was drained).
        assert agent.running and envoy_pid(agent) == pid
        assert (
            after["sds.kubernetes_bookinfo-cert.update_success"]
            > stats["sds.kubernetes_bookinfo-cert.update_success"]
        )
        assert after["listener_manager.listener_modified"] == stats["listener_manager.listener_modified"]
        assert agent.envoy().rejected_updates() == {}
        # The other server is untouched.
        assert serves(gw, gw.mutual_port, MUTUAL_HOST, certs.client) == (
            200,
            "productpage-v1",
            certs.mutual[0].serial_number,
        )
    assert gateway_mesh.meshpilot.metric("pilot_sds_certificate_errors_total") == errors


async def test_an_account_without_access_to_secrets_gets_the_ca_and_not_the_key(
    gateway_mesh: GatewayMesh,
) -> None:
    """A proxy of the Secrets' namespace whose account the API server's RBAC grants nothing."""
    mp = gateway_mesh.meshpilot
    token = service_account_token(gateway_mesh.kube, "no-secrets", "istio-system")
    errors = mp.metric("pilot_sds_certificate_errors_total")
    client = AdsClient(f"127.0.0.1:{mp.secure_grpc_port}", secure=Secure(gateway_mesh.root_pem, token=token))
    served: list[list[str]] = []
    try:
        client.send(
            SECRET_TYPE,
            ["kubernetes://bookinfo-cert", "kubernetes://secure-cert-cacert"],
            node_id="router~127.0.65.13~gw-other.istio-system~istio-system.svc.cluster.local",
            node_metadata={
                "NAMESPACE": "istio-system",
                "SERVICE_ACCOUNT": "no-secrets",
                "ISTIO_VERSION": "1.28.0",
            },
        )
        # Until the SubjectAccessReview's deny is counted: each answer until then, and one after.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                response = await client.recv(timeout=1)
            except TimeoutError:
                if mp.metric("pilot_sds_certificate_errors_total") > errors:
                    break
                continue
            served.append([_secret_name(r.value) for r in response.resources])
            client.ack(response, ["kubernetes://bookinfo-cert", "kubernetes://secure-cert-cacert"])
    finally:
        await client.close()
    assert mp.metric("pilot_sds_certificate_errors_total") > errors
    assert "no-secrets/istio-system is not authorized to read secrets" in mp.log()
    assert served and all(names == ["kubernetes://secure-cert-cacert"] for names in served), served


def _secret_name(raw: bytes) -> str:
    return secret_pb2.Secret.FromString(raw).name
