"""meshpilot reading a Kubernetes API server, shown by a real Envoy and real traffic.

meshpilot is a subprocess given a kubeconfig, exactly as with a real cluster. The API server is
the emulator (``emulator``: in the test process) and Kubernetes' own kube-apiserver over etcd
(``kube-apiserver``: built by `make reference`, one per module, reset before each test). Tests
that need what only the emulator does on demand (going away, 410, a failing request) or loopback
endpoint addresses (a real API server refuses 127.0.0.0/8 in EndpointSlices) take ``emulated_api``.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from integration.conftest import MeshHarness
from support.ads_client import AdsClient
from support.kube import egress_sidecar, endpoint_slice, istio, namespace, pod, service, workload, write
from support.kube_api import KubeApiServer
from support.processes import Envoy, Meshpilot, http_get
from support.real_kube import KubeApi, RealKubeApiServer
from support.wait import eventually

pytestmark = [pytest.mark.integration]

CLIENT_IP = "127.0.66.11"
PORT = 9080
REVIEWS_HOST = "reviews.default.svc.cluster.local"
CLUSTER = f"outbound|{PORT}||{REVIEWS_HOST}"


@pytest.fixture(scope="module")
def real_api() -> Iterator[RealKubeApiServer]:
    with RealKubeApiServer() as server:
        yield server


@pytest.fixture(
    params=[
        pytest.param("emulator", id="emulator"),
        pytest.param("kube-apiserver", id="kube-apiserver", marks=pytest.mark.reference),
    ]
)
def api(request: pytest.FixtureRequest) -> Iterator[KubeApi]:
    """The emulator, or the module's real API server emptied of what earlier tests made."""
    if request.param == "emulator":
        with KubeApiServer() as emulator:
            yield emulator
        return
    server: RealKubeApiServer = request.getfixturevalue("real_api")
    server.reset()
    yield server


@pytest.fixture
def emulated_api() -> Iterator[KubeApiServer]:
    """For the faults only the emulator makes on demand, and loopback endpoint addresses."""
    with KubeApiServer() as server:
        yield server


def mesh_configmap(mesh: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "istio", "namespace": "istio-system"},
        "data": {"mesh": yaml.safe_dump(mesh)},
    }


def client_objects() -> list[dict[str, Any]]:
    """The client's Service and Pod (which the sidecar is), without endpoints: nothing calls it, and
    a real API server refuses loopback endpoint addresses."""
    return [
        namespace("default"),
        service("client", "default", "10.96.0.10", [("http", PORT)], {"app": "client"}),
        pod("client-1", "default", CLIENT_IP, {"app": "client"}, service_account="client"),
        egress_sidecar("client", CLIENT_IP),
    ]


def reviews(instances: dict[str, str]) -> list[dict[str, Any]]:
    versions = {name: name.rsplit("-", 1)[1] for name in instances}
    return workload("reviews", "default", "10.96.0.20", PORT, instances, versions=versions)


def reviews_slice(*pods: tuple[str, str]) -> dict[str, Any]:
    return endpoint_slice("reviews-slice", "default", "reviews", [("http", PORT)], list(pods))


def answer(path: str = "/") -> str:
    status, body, _ = http_get(CLIENT_IP, PORT, path, {"Host": "reviews"})
    assert status == 200, (status, body)
    return str(json.loads(body)["name"])


@pytest.mark.envoy
def test_pods_and_slices_from_the_api_move_envoy_endpoints(
    mesh: MeshHarness, emulated_api: KubeApiServer
) -> None:
    for obj in [*client_objects(), *reviews({"reviews-v1": "127.0.66.21"})]:
        emulated_api.apply(obj)
    mesh.backend("reviews-v1", "127.0.66.21", PORT)
    mesh.backend("reviews-v2", "127.0.66.22", PORT)
    mp = mesh.start_meshpilot(
        config_dir=None, kubeconfig=emulated_api.write_kubeconfig(mesh.tmp / "kubeconfig")
    )
    envoy = mesh.sidecar("client-1", CLIENT_IP, labels={"app": "client"})
    eventually(lambda: envoy.endpoints(CLUSTER) == ["127.0.66.21:9080"], what="the first endpoint")
    assert answer() == "reviews-v1"
    pushes = {t: mp.metric(f'pilot_xds_pushes{{type="{t}"}}') for t in ("eds", "cds", "lds")}

    # A second pod and its endpoint: an EDS-only push, and traffic reaches it.
    emulated_api.apply(
        pod("reviews-v2", "default", "127.0.66.22", {"app": "reviews", "version": "v2"}, "reviews")
    )
    emulated_api.apply(reviews_slice(("reviews-v1", "127.0.66.21"), ("reviews-v2", "127.0.66.22")))
    eventually(lambda: sorted(envoy.endpoints(CLUSTER)) == ["127.0.66.21:9080", "127.0.66.22:9080"])
    eventually(lambda: {answer() for _ in range(20)} == {"reviews-v1", "reviews-v2"}, what="both answer")
    # The first pod goes away.
    emulated_api.apply(reviews_slice(("reviews-v2", "127.0.66.22")))
    emulated_api.delete("pods", "default", "reviews-v1")
    eventually(lambda: envoy.endpoints(CLUSTER) == ["127.0.66.22:9080"])
    assert {answer() for _ in range(10)} == {"reviews-v2"}
    assert mp.metric('pilot_xds_pushes{type="eds"}') > pushes["eds"]
    assert mp.metric('pilot_xds_pushes{type="cds"}') == pushes["cds"], "endpoint changes push EDS only"
    assert mp.metric('pilot_xds_pushes{type="lds"}') == pushes["lds"], "endpoint changes push EDS only"
    assert mp.metric('pilot_k8s_reg_events{event="add",type="Pods"}') == 3
    assert mp.metric('pilot_k8s_reg_events{event="delete",type="Pods"}') == 1

    # The API server goes away: meshpilot keeps serving the last state, and catches up when it is back.
    emulated_api.stop_listening()
    time.sleep(1.0)
    assert {answer() for _ in range(5)} == {"reviews-v2"}
    assert mp.get("/ready")[0] == 200
    emulated_api.apply(
        pod("reviews-v1", "default", "127.0.66.21", {"app": "reviews", "version": "v1"}, "reviews")
    )
    emulated_api.apply(reviews_slice(("reviews-v1", "127.0.66.21"), ("reviews-v2", "127.0.66.22")))
    emulated_api.start_listening()
    eventually(
        lambda: sorted(envoy.endpoints(CLUSTER)) == ["127.0.66.21:9080", "127.0.66.22:9080"], timeout=20
    )
    assert envoy.rejected_updates() == {}


def route_clusters(envoy: Envoy) -> set[str]:
    """The clusters Envoy's route ``9080`` sends the reviews host to."""
    for config in envoy.config_dump()["configs"]:
        for dynamic in config.get("dynamic_route_configs", []):
            if dynamic["route_config"]["name"] != str(PORT):
                continue
            for vhost in dynamic["route_config"].get("virtual_hosts", []):
                if "reviews" in vhost["domains"]:
                    return {r["route"]["cluster"] for r in vhost["routes"] if "cluster" in r.get("route", {})}
    return set()


@pytest.mark.envoy
def test_virtual_service_created_through_the_api_changes_traffic(mesh: MeshHarness, api: KubeApi) -> None:
    """The route follows a VirtualService from the API; traffic shows it where endpoints may be loopback
    addresses (the emulator), the endpoints Envoy got from the slices where they may not."""
    traffic = isinstance(api, KubeApiServer)
    v1, v2 = ("127.0.66.31", "127.0.66.32") if traffic else ("10.66.0.31", "10.66.0.32")
    for obj in [*client_objects(), *reviews({"reviews-v1": v1, "reviews-v2": v2})]:
        api.apply(obj)
    if traffic:
        mesh.backend("reviews-v1", v1, PORT)
        mesh.backend("reviews-v2", v2, PORT)
    mp = mesh.start_meshpilot(config_dir=None, kubeconfig=api.write_kubeconfig(mesh.tmp / "kubeconfig"))
    envoy = mesh.sidecar("client-1", CLIENT_IP, labels={"app": "client"})
    eventually(lambda: route_clusters(envoy) == {CLUSTER}, what="the route to the reviews service")
    eventually(
        lambda: sorted(envoy.endpoints(CLUSTER)) == sorted([f"{v1}:{PORT}", f"{v2}:{PORT}"]),
        what="both endpoints",
    )
    if traffic:
        eventually(lambda: {answer() for _ in range(20)} == {"reviews-v1", "reviews-v2"}, what="round robin")
    with api.api_client() as client:
        from kubernetes.client import CustomObjectsApi

        objects = CustomObjectsApi(client)
        objects.create_namespaced_custom_object(
            "networking.istio.io",
            "v1",
            "default",
            "destinationrules",
            istio(
                "DestinationRule",
                "reviews",
                "default",
                {"host": "reviews", "subsets": [{"name": v, "labels": {"version": v}} for v in ("v1", "v2")]},
            ),
        )
        objects.create_namespaced_custom_object(
            "networking.istio.io",
            "v1",
            "default",
            "virtualservices",
            istio(
                "VirtualService",
                "reviews",
                "default",
                {
                    "hosts": ["reviews"],
                    "http": [{"route": [{"destination": {"host": "reviews", "subset": "v2"}}]}],
                },
            ),
        )
    subset_v2 = f"outbound|{PORT}|v2|{REVIEWS_HOST}"
    eventually(lambda: route_clusters(envoy) == {subset_v2}, what="the route to subset v2")
    assert envoy.endpoints(subset_v2) == [f"{v2}:{PORT}"]
    if traffic:
        eventually(lambda: {answer() for _ in range(10)} == {"reviews-v2"}, what="all traffic to v2")
    assert mp.metric('pilot_k8s_cfg_events{event="add",type="VirtualService"}') == 1
    # An invalid update is rejected and counted; the last valid VirtualService keeps routing.
    api.apply(istio("VirtualService", "reviews", "default", {"hosts": ["reviews"], "http": [{"route": []}]}))
    eventually(lambda: mp.metric("meshpilot_config_rejected_objects") == 1, what="the rejection counted")
    assert route_clusters(envoy) == {subset_v2}
    if traffic:
        assert {answer() for _ in range(10)} == {"reviews-v2"}
    assert envoy.rejected_updates() == {}


def test_ready_only_after_the_initial_lists(mesh: MeshHarness, emulated_api: KubeApiServer) -> None:
    """An API server that is not there yet: /ready is 503 and ADS streams get UNAVAILABLE until it is."""
    import asyncio

    import grpc

    kubeconfig = emulated_api.write_kubeconfig(mesh.tmp / "kubeconfig")
    emulated_api.stop_listening()
    mp = mesh.start_meshpilot(config_dir=None, kubeconfig=kubeconfig, wait=False)
    eventually(lambda: mp.get("/ready")[0] == 503, what="/ready answering 503")

    async def stream_status() -> grpc.StatusCode | None:
        client = AdsClient(f"127.0.0.1:{mp.grpc_port}")
        try:
            client.send(
                "type.googleapis.com/envoy.config.cluster.v3.Cluster",
                node_id="sidecar~127.0.66.99~x.default~default.svc.cluster.local",
            )
            await client.recv(timeout=5)
            return None
        except grpc.aio.AioRpcError as err:
            return err.code()
        finally:
            await client.close()

    assert asyncio.run(stream_status()) is grpc.StatusCode.UNAVAILABLE
    time.sleep(0.5)
    assert mp.get("/ready")[0] == 503
    emulated_api.start_listening()
    mp.wait_ready(timeout=30)


@pytest.mark.envoy
def test_mesh_config_configmap_is_watched(mesh: MeshHarness, api: KubeApi) -> None:
    """discoverySelectors from the ConfigMap limit what Envoy gets; changing it pushes to Envoy."""
    api.apply(namespace("default", mesh="yes"))
    api.apply(namespace("other"))
    api.apply(namespace("istio-system"))
    api.apply(pod("client-1", "default", CLIENT_IP, {"app": "client"}, service_account="client"))
    # The client sees every namespace, so only the selectors decide whether b is served.
    everywhere = {
        "workloadSelector": {"labels": {"app": "client"}},
        "egress": [{"bind": CLIENT_IP, "hosts": ["*/*"]}],
    }
    api.apply(istio("Sidecar", "client", "default", everywhere))
    api.apply(service("a", "default", "10.96.1.1", [("http", 80)]))
    api.apply(service("b", "other", "10.96.1.2", [("http", 80)]))
    api.apply(mesh_configmap({"discoverySelectors": [{"matchLabels": {"mesh": "yes"}}]}))
    mp = mesh.start_meshpilot(config_dir=None, kubeconfig=api.write_kubeconfig(mesh.tmp / "kubeconfig"))
    envoy = mesh.sidecar("client-1", CLIENT_IP, labels={"app": "client"})
    a, b = "outbound|80||a.default.svc.cluster.local", "outbound|80||b.other.svc.cluster.local"
    eventually(lambda: a in envoy.dynamic_clusters(), what="a's cluster in Envoy")
    assert b not in envoy.dynamic_clusters()
    api.apply(mesh_configmap({}))
    eventually(lambda: b in envoy.dynamic_clusters(), what="b's cluster after the selectors are removed")
    assert mp.metric('pilot_push_triggers{type="global"}') >= 1
    # An invalid MeshConfig is rejected and the last valid one stays.
    api.apply(mesh_configmap({"connectTimeout": "soon"}))
    eventually(lambda: "key mesh rejected" in mp.log(), what="the rejection logged")
    assert b in envoy.dynamic_clusters()
    assert envoy.rejected_updates() == {}


def test_a_mesh_config_file_wins_over_the_configmap(mesh: MeshHarness, api: KubeApi) -> None:
    """As istiod with a mesh file: the file is used (its discoverySelectors too), the ConfigMap unread."""
    api.apply(namespace("default", mesh="yes"))
    api.apply(namespace("other"))
    api.apply(service("a", "default", "10.96.1.1", [("http", 80)]))
    api.apply(service("b", "other", "10.96.1.2", [("http", 80)]))
    api.apply(namespace("istio-system"))
    api.apply(mesh_configmap({}))
    mesh_file = mesh.tmp / "mesh.yaml"
    mesh_file.write_text(yaml.safe_dump({"discoverySelectors": [{"matchLabels": {"mesh": "yes"}}]}))
    mp = mesh.start_meshpilot(
        config_dir=None, kubeconfig=api.write_kubeconfig(mesh.tmp / "kubeconfig"), mesh_config=mesh_file
    )
    hosts = {s["hostname"] for s in mp.get_json("/debug/registryz")}
    assert "a.default.svc.cluster.local" in hosts
    assert "b.other.svc.cluster.local" not in hosts


def test_same_objects_from_api_and_directory_give_identical_config(mesh: MeshHarness, api: KubeApi) -> None:
    import asyncio

    objects = [
        *client_objects(),
        *reviews({"reviews-v1": "10.66.0.41", "reviews-v2": "10.66.0.42"}),
        istio(
            "DestinationRule",
            "reviews",
            "default",
            {
                "host": "reviews",
                "trafficPolicy": {"connectionPool": {"tcp": {"maxConnections": 7}}},
                "subsets": [{"name": v, "labels": {"version": v}} for v in ("v1", "v2")],
            },
        ),
        istio(
            "VirtualService",
            "reviews",
            "default",
            {
                "hosts": ["reviews"],
                "http": [
                    {
                        "match": [{"headers": {"x-user": {"exact": "jason"}}}],
                        "route": [{"destination": {"host": "reviews", "subset": "v2"}}],
                    },
                    {"route": [{"destination": {"host": "reviews", "subset": "v1"}}], "timeout": "3s"},
                ],
            },
        ),
    ]
    for obj in objects:
        api.apply(obj)
    # A real API server serves its own `kubernetes` Service: the directory holds it too.
    own = [s for s in api.objects("services", "default") if s["metadata"]["name"] == "kubernetes"]
    write(mesh.config_dir / "all.yaml", [*objects, *own])
    from_api = mesh.start_meshpilot(config_dir=None, kubeconfig=api.write_kubeconfig(mesh.tmp / "kubeconfig"))
    from_dir = mesh.start_meshpilot(log_name="meshpilot-dir.log")

    async def fetch(mp: Meshpilot) -> dict[str, list[bytes]]:
        client = AdsClient(f"127.0.0.1:{mp.grpc_port}")
        who: dict[str, Any] = {
            "node_id": f"sidecar~{CLIENT_IP}~client-1.default~default.svc.cluster.local",
            "node_metadata": {
                "NAMESPACE": "default",
                "CLUSTER_ID": "Kubernetes",
                "ISTIO_VERSION": "1.28.0",
                "INTERCEPTION_MODE": "NONE",
                "LABELS": {"app": "client"},
            },
        }
        out: dict[str, list[bytes]] = {}
        try:
            for short in ("cluster.v3.Cluster", "listener.v3.Listener"):
                url = f"type.googleapis.com/envoy.config.{short}"
                client.send(url, **who)
                response = await client.recv(timeout=10)
                out[short] = sorted(r.value for r in response.resources)
            client.send(
                "type.googleapis.com/envoy.config.route.v3.RouteConfiguration", names=[str(PORT)], **who
            )
            out["route"] = sorted(r.value for r in (await client.recv(timeout=10)).resources)
            cla = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
            client.send(cla, names=[CLUSTER, f"outbound|{PORT}|v1|{REVIEWS_HOST}"], **who)
            out["eds"] = sorted(r.value for r in (await client.recv(timeout=10)).resources)
        finally:
            await client.close()
        return out

    a, b = asyncio.run(fetch(from_api)), asyncio.run(fetch(from_dir))
    assert a.keys() == b.keys()
    for type_ in a:
        assert a[type_], type_
        assert a[type_] == b[type_], f"{type_} differs between the API and the directory"


def _replica(mesh: MeshHarness, api: KubeApi, name: str) -> Meshpilot:
    return mesh.start_meshpilot(
        config_dir=None,
        kubeconfig=api.write_kubeconfig(mesh.tmp / "kubeconfig"),
        extra=["--enable-status", "--lease-duration", "2s"],
        env={"POD_NAME": name},
        log_name=f"{name}.log",
    )


def test_two_replicas_one_leader_and_a_takeover(mesh: MeshHarness, api: KubeApi) -> None:
    api.apply(namespace("istio-system"))
    api.apply(
        istio(
            "VirtualService",
            "vs",
            "default",
            {"hosts": ["web"], "http": [{"route": [{"destination": {"host": "web"}}]}]},
        )
    )
    first = _replica(mesh, api, "istiod-a")
    eventually(
        lambda: (
            (api.get("leases", "istio-system", "istio-status-leader") or {})
            .get("spec", {})
            .get("holderIdentity")
            == "istiod-a"
        )
    )
    second = _replica(mesh, api, "istiod-b")
    eventually(
        lambda: (
            (api.get("virtualservices", "default", "vs") or {}).get("status", {}).get("observedGeneration")
            == 1
        )
    )
    time.sleep(1.5)  # a few retry periods: the second replica must not take the Lease from a live leader
    lease = api.get("leases", "istio-system", "istio-status-leader")
    assert lease is not None and lease["spec"]["holderIdentity"] == "istiod-a"
    assert "istiod-b is leading" not in second.log()
    # The leader dies without releasing: the other replica takes over after the lease duration.
    assert first.proc is not None
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(5)
    killed = time.monotonic()
    eventually(
        lambda: (
            (api.get("leases", "istio-system", "istio-status-leader") or {})
            .get("spec", {})
            .get("holderIdentity")
            == "istiod-b"
        ),
        timeout=10,
    )
    # The lease counts from b's sight of a's last renewal (up to a retry after the kill), then b
    # tries every retry: the duration, two retries and a busy host's API calls.
    assert time.monotonic() - killed < 2 + 2 * 0.5 + 2, "taken over soon after the lease duration"
    # The new leader writes status: a new generation of the object gets its observedGeneration.
    api.apply(
        istio(
            "VirtualService",
            "vs",
            "default",
            {"hosts": ["web2"], "http": [{"route": [{"destination": {"host": "web2"}}]}]},
        )
    )
    generation = (api.get("virtualservices", "default", "vs") or {})["metadata"]["generation"]
    assert generation == 2
    eventually(
        lambda: (
            (api.get("virtualservices", "default", "vs") or {}).get("status", {}).get("observedGeneration")
            == 2
        )
    )


@pytest.mark.envoy
def test_multicluster_secret_adds_and_removes_a_cluster(mesh: MeshHarness, api: KubeApi) -> None:
    """Endpoints of a remote cluster reach Envoy (and traffic reaches them) while its Secret exists."""
    with KubeApiServer() as remote:
        for obj in client_objects():
            api.apply(obj)
        api.apply(namespace("istio-system"))
        api.apply(service("reviews", "default", "10.96.0.20", [("http", PORT)], {"app": "reviews"}))
        mesh.backend("reviews-r1", "127.0.66.51", PORT)
        remote.apply(namespace("default"))
        for obj in reviews({"reviews-r1": "127.0.66.51"}):
            remote.apply(obj)
        mp = mesh.start_meshpilot(config_dir=None, kubeconfig=api.write_kubeconfig(mesh.tmp / "kubeconfig"))
        envoy = mesh.sidecar("client-1", CLIENT_IP, labels={"app": "client"})
        eventually(lambda: CLUSTER in envoy.dynamic_clusters(), what="the reviews cluster")
        assert envoy.endpoints(CLUSTER) == [], "the local cluster has no reviews endpoints"

        def shards() -> dict[str, Any]:
            for svc in mp.get_json("/debug/endpointShardz").get(REVIEWS_HOST, {}).values():
                return dict(svc.get("Shards", {}))
            return {}

        kubeconfig = remote.write_kubeconfig(mesh.tmp / "remote-kubeconfig").read_bytes()
        secret = _remote_secret("istio-remote-secret-west", "west", kubeconfig)
        api.apply(secret)
        eventually(lambda: "Kubernetes/west" in shards(), what="the remote cluster's shard")
        assert "127.0.66.51" in json.dumps(shards()["Kubernetes/west"])
        eventually(
            lambda: envoy.endpoints(CLUSTER) == ["127.0.66.51:9080"], what="the remote endpoint in Envoy"
        )
        eventually(lambda: answer() == "reviews-r1", what="traffic to the remote cluster's pod")
        api.delete("secrets", "istio-system", "istio-remote-secret-west")
        eventually(lambda: "127.0.66.51" not in json.dumps(shards()), what="the remote endpoints removed")
        eventually(lambda: envoy.endpoints(CLUSTER) == [], what="the remote endpoint gone from Envoy")
        assert envoy.rejected_updates() == {}


def _remote_secret(name: str, cluster: str, kubeconfig: bytes) -> dict[str, Any]:
    import base64

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": "istio-system", "labels": {"istio/multiCluster": "true"}},
        "data": {cluster: base64.b64encode(kubeconfig).decode()},
    }


def test_ready_waits_for_remote_clusters_up_to_the_timeout(mesh: MeshHarness, api: KubeApi) -> None:
    with KubeApiServer() as up, KubeApiServer() as down:
        for remote in (up, down):
            remote.apply(namespace("default"))
        for obj in reviews({"reviews-r1": "127.0.66.61"}):
            up.apply(obj)
        api.apply(namespace("default"))
        api.apply(namespace("istio-system"))
        api.apply(_remote_secret("remote-up", "up", up.write_kubeconfig(mesh.tmp / "up").read_bytes()))
        api.apply(
            _remote_secret("remote-down", "down", down.write_kubeconfig(mesh.tmp / "down").read_bytes())
        )
        down.stop_listening()
        mp = mesh.start_meshpilot(
            config_dir=None,
            kubeconfig=api.write_kubeconfig(mesh.tmp / "kubeconfig"),
            extra=["--remote-cluster-timeout", "2s"],
            wait=False,
        )
        started = time.monotonic()
        eventually(lambda: mp.get("/ready")[0] == 503, what="not ready while a remote cluster is away")
        mp.wait_ready(timeout=20)
        assert time.monotonic() - started >= 1.5, "ready only after the remote cluster timeout"
        assert "remote clusters down not synced after 2 s" in mp.log()
        # The cluster that answered was synced before ready: its endpoints are there already.
        shards = mp.get_json("/debug/endpointShardz")[REVIEWS_HOST]["default"]["Shards"]
        assert "127.0.66.61" in json.dumps(shards.get("Kubernetes/up", []))
