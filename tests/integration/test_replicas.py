"""meshpilot replicas behind one Service, against Kubernetes' own kube-apiserver, as istiod scales out.

Every replica reads the whole model from the API server and serves any proxy; the writers that must be
single are: status (the ``istio-status-leader`` Lease), the ``istio-ca-root-cert`` ConfigMaps (the
``istio-namespace-controller-election`` Lease) and the CA's ``istio-ca-secret`` (made once: of two
creates the API server accepts one, and both replicas sign with it). A TCP balancer in front of the
replicas' xDS ports spreads new connections round-robin, as the ``istiod`` Service does. The first two
replicas have push workers (the command's default), the third is a single process, as a rollout
that changes ``--push-workers`` would mix them.

Who wrote what is read from the API server's own audit log: each replica talks to it with a client
certificate of its own name, so every write there names its replica.

The timings printed (``replica timings``) go to bench/notes.md.
"""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID
from integration.conftest import MeshHarness
from support.ads_recorder import Recorder
from support.kube import endpoint_slice, istio, namespace, pod, service
from support.processes import Envoy, Meshpilot
from support.real_kube import RealKubeApiServer, issue
from support.tcp_balancer import Backend, TcpBalancer
from support.wait import eventually

from meshpilot.kube.leader import NAMESPACE_CONTROLLER_LEASE, STATUS_LEASE
from meshpilot.kube.root_cert import ROOT_CERT_CONFIGMAP, ROOT_CERT_KEY
from meshpilot.xds.types import TypeUrl

pytestmark = [pytest.mark.integration, pytest.mark.reference, pytest.mark.envoy, pytest.mark.timeout(240)]

ISTIO_NS = "istio-system"
APPS = "apps"
LEASE = 3.0  # seconds: renew deadline 1.5, retry 0.75
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {
            "level": "Metadata",
            "verbs": ["create", "update", "patch", "delete"],
            "resources": [
                {"group": "", "resources": ["configmaps", "secrets"]},
                {"group": "coordination.k8s.io", "resources": ["leases"]},
                {"group": "networking.istio.io", "resources": ["virtualservices", "virtualservices/status"]},
            ],
        },
        {"level": "None"},
    ],
}
RECORDERS = 8


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[tuple[RealKubeApiServer, Path]]:
    """The real API server, auditing writes to what the single writers write; and its audit log."""
    audit_log = tmp_path / "audit.log"
    policy = tmp_path / "audit-policy.yaml"
    policy.write_text(yaml.safe_dump(AUDIT_POLICY))
    server = RealKubeApiServer(
        tmp_path / "kube",
        apiserver_args=[
            f"--audit-policy-file={policy}",
            f"--audit-log-path={audit_log}",
            "--audit-log-mode=blocking",
        ],
    ).start()
    try:
        yield server, audit_log
    finally:
        server.stop()


@pytest.fixture
def own_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each simulated proxy on a TCP connection of its own, as separate proxies are: gRPC shares one
    connection between the channels of a process that have the same target, which would put every
    simulated proxy on one replica."""
    shared = grpc.aio.insecure_channel

    def own(target: str, options: Any = None, *args: Any, **kwargs: Any) -> grpc.aio.Channel:
        options = [*(options or ()), ("grpc.use_local_subchannel_pool", 1)]
        return shared(target, options, *args, **kwargs)

    monkeypatch.setattr(grpc.aio, "insecure_channel", own)


def kubeconfig_as(kube: RealKubeApiServer, path: Path, user: str) -> Path:
    """A kubeconfig whose client certificate names ``user`` (in ``system:masters``)."""
    kube.write_kubeconfig(path)
    cert, key = issue(
        kube.ca,
        x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
                x509.NameAttribute(NameOID.COMMON_NAME, user),
            ]
        ),
        server=False,
    )
    config = yaml.safe_load(path.read_text())
    config["users"][0]["user"] = {
        "client-certificate-data": base64.b64encode(cert).decode(),
        "client-key-data": base64.b64encode(key).decode(),
    }
    path.write_text(yaml.safe_dump(config))
    return path


def audit(log: Path) -> list[dict[str, Any]]:
    """Completed writes: (user, verb, resource[/subresource], namespace/name, code, when)."""
    events = []
    for line in log.read_text().splitlines():
        event = json.loads(line)
        if event.get("stage") != "ResponseComplete":
            continue
        ref = event.get("objectRef") or {}
        resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        events.append(
            {
                "user": event["user"]["username"],
                "verb": event["verb"],
                "resource": resource,
                "name": f"{ref.get('namespace', '')}/{ref.get('name', '')}",
                "code": (event.get("responseStatus") or {}).get("code", 0),
                "at": event["stageTimestamp"],
            }
        )
    return events


def holder(kube: RealKubeApiServer, lease: str) -> str:
    found = kube.get("leases", ISTIO_NS, lease) or {}
    return str(found.get("spec", {}).get("holderIdentity") or "")


def observed(kube: RealKubeApiServer, ns: str, name: str) -> int | None:
    found = kube.get("virtualservices", ns, name) or {}
    value = found.get("status", {}).get("observedGeneration")
    return int(value) if value is not None else None


def model(kube: RealKubeApiServer) -> None:
    """Two Services with endpoints, a VirtualService for the proxies, and one only its namespace sees
    (its status changes; the proxies' config does not)."""
    kube.apply(namespace(APPS))
    kube.apply(namespace("elsewhere"))
    for i, name in enumerate(("web", "api")):
        labels = {"app": name}
        kube.apply(service(name, APPS, f"10.96.1.{10 + i}", [("http", 8080)], labels))
        pods = [(f"{name}-{n}", f"10.1.{i}.{n + 1}") for n in range(2)]
        for pod_name, ip in pods:
            kube.apply(pod(pod_name, APPS, ip, labels))
        kube.apply(endpoint_slice(f"{name}-1", APPS, name, [("http", 8080)], pods))
    kube.apply(
        istio(
            "VirtualService",
            "web",
            APPS,
            {"hosts": ["web"], "http": [{"route": [{"destination": {"host": "web"}}]}]},
        )
    )
    kube.apply(other_virtual_service("a"))


def other_virtual_service(host: str) -> dict[str, Any]:
    return istio(
        "VirtualService",
        "other",
        "elsewhere",
        {"hosts": [host], "exportTo": ["."], "http": [{"route": [{"destination": {"host": host}}]}]},
    )


class Proxy:
    """A proxy as simulated: one ADS stream (delta or state of the world) through the balancer; when
    it breaks, the proxy connects again through the balancer, as Envoy does."""

    def __init__(self, target: str, index: int) -> None:
        self.target = target
        self.name = f"r{index}"
        self.id = f"{self.name}.{APPS}"
        self.node = f"sidecar~10.1.9.{index + 1}~{self.id}~{APPS}.svc.cluster.local"
        self.delta = index % 2 == 0
        self.recorder: Recorder | None = None

    async def connect(self, timeout: float = 10) -> None:
        """Subscribe, trying again while the connection is refused, as Envoy does: a replica killed
        a moment ago can still complete a handshake from its listen queue, then reset it."""
        metadata = {"NAMESPACE": APPS, "ISTIO_VERSION": "1.28.0", "CLUSTER_ID": "Kubernetes"}
        deadline = time.monotonic() + timeout
        while True:
            self.recorder = Recorder(self.target, self.node, metadata, delta=self.delta)
            try:
                await self.recorder.subscribe()
                return
            except grpc.aio.AioRpcError as e:
                await self.recorder.close()
                if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.2)

    def held(self) -> dict[TypeUrl, dict[str, bytes]]:
        assert self.recorder is not None
        return {t: dict(v) for t, v in self.recorder.held.items()}

    async def broken(self, timeout: float) -> bool:
        """Whether the stream ends (with an error) within ``timeout`` (responses before it are read)."""
        assert self.recorder is not None
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                await self.recorder.client.recv(timeout=left)
            except TimeoutError:
                return False
            except Exception:  # the stream's end, whatever gRPC calls it
                return True
        return False

    async def close(self) -> None:
        if self.recorder is not None:
            await self.recorder.close()


def served_by(replicas: dict[str, Meshpilot]) -> dict[str, str]:
    """proxy ID -> the replica holding its stream, from every replica's /debug/syncz."""
    out: dict[str, str] = {}
    for name, mp in replicas.items():
        if not mp.running:
            continue
        for status in mp.get_json("/debug/syncz"):
            assert status["proxy"] not in out, f"{status['proxy']} on two replicas"
            out[status["proxy"]] = name
    return out


def acked_on(mp: Meshpilot, proxy: str) -> bool:
    for status in mp.get_json("/debug/syncz"):
        if status["proxy"] == proxy:
            return bool(
                status["cluster_acked"] == status["cluster_sent"]
                and status["listener_acked"] == status["listener_sent"]
                and status["cluster_sent"]
            )
    return False


def envoy_resources(envoy: Envoy) -> dict[str, list[str]]:
    """Names of the clusters, listeners and routes Envoy got over xDS (its config_dump)."""
    status, body = envoy.admin("/config_dump")
    assert status == 200
    out: dict[str, list[str]] = {}
    for config in json.loads(body)["configs"]:
        kind = config["@type"].rsplit(".", 1)[-1]
        for key in ("dynamic_active_clusters", "dynamic_listeners", "dynamic_route_configs"):
            for item in config.get(key, []):
                name = item.get("cluster", item.get("route_config", {})).get("name") or item.get("name")
                out.setdefault(f"{kind}.{key}", []).append(str(name))
    return {k: sorted(v) for k, v in out.items()}


def serving_root_ok(mp: Meshpilot, root_pem: str) -> bool:
    """The replica's secure xDS port presents a certificate that chains to ``root_pem``."""
    context = ssl.create_default_context(cadata=root_pem)
    context.check_hostname = False
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection(("127.0.0.1", mp.secure_grpc_port), timeout=5) as sock,
        context.wrap_socket(sock) as tls,
    ):
        return tls.getpeercert(binary_form=True) is not None


@pytest.mark.usefixtures("own_connections")
async def test_replicas_share_the_proxies_and_one_leader_writes(
    mesh: MeshHarness, kube: tuple[RealKubeApiServer, Path]
) -> None:
    api, audit_log = kube
    model(api)
    timings: dict[str, float] = {}

    def start(name: str) -> Meshpilot:
        # The first two with two push workers (the command's default on this machine's two cores,
        # fixed so that every machine runs the same test), so that the replica killed is a main
        # process whose workers must stop with it; the third is one process, of the other shape.
        workers = "1" if name == "istiod-c" else "2"
        return mesh.start_meshpilot(
            config_dir=None,
            kubeconfig=kubeconfig_as(api, mesh.tmp / f"{name}.kubeconfig", name),
            extra=["--enable-status", "--lease-duration", f"{LEASE}s", "--push-workers", workers],
            env={"POD_NAME": name},
            log_name=f"{name}.log",
            wait=False,
        )

    # Two replicas start together: both find no CA Secret, both make a root, one create wins.
    started = time.monotonic()
    replicas = {name: start(name) for name in ("istiod-a", "istiod-b")}
    for mp in replicas.values():
        await asyncio.to_thread(mp.wait_ready, 60)
    timings["two replicas ready (s)"] = time.monotonic() - started

    # -- One CA ----------------------------------------------------------------------------------
    secret = api.get("secrets", ISTIO_NS, "istio-ca-secret")
    assert secret is not None
    root = base64.b64decode(secret["data"]["ca-cert.pem"]).decode()
    for mp in replicas.values():
        assert serving_root_ok(mp, root), "each replica's secure port chains to the one root"
    made = [n for n, mp in replicas.items() if "made a self-signed root" in mp.log()]
    assert len(made) == 1, f"replicas that say they made the root: {made}"
    creates = [
        e for e in audit(audit_log) if e["resource"] == "secrets" and e["name"].endswith("/istio-ca-secret")
    ]
    assert [e["code"] for e in creates if e["verb"] == "create" and e["code"] == 201] == [201], creates

    # -- One leader per election; only it writes -------------------------------------------------
    status_leader = await asyncio.to_thread(
        eventually, lambda: holder(api, STATUS_LEASE), timeout=20, what="a status leader"
    )
    ns_leader = await asyncio.to_thread(
        eventually, lambda: holder(api, NAMESPACE_CONTROLLER_LEASE), timeout=20, what="a namespace leader"
    )
    assert {status_leader, ns_leader} <= set(replicas)
    await asyncio.to_thread(
        eventually,
        lambda: observed(api, APPS, "web") == 1 and observed(api, "elsewhere", "other") == 1,
        timeout=20,
        what="status written",
    )
    for ns in (APPS, "elsewhere", "default"):
        configmap = await asyncio.to_thread(
            eventually, lambda ns=ns: api.get("configmaps", ns, ROOT_CERT_CONFIGMAP), timeout=20, what=ns
        )
        assert configmap["data"][ROOT_CERT_KEY] == root
    writes = audit(audit_log)
    status_writers = {e["user"] for e in writes if e["resource"] == "virtualservices/status"}
    configmap_writers = {
        e["user"] for e in writes if e["resource"] == "configmaps" and e["name"].endswith(ROOT_CERT_CONFIGMAP)
    }
    assert status_writers == {status_leader}, writes
    assert configmap_writers == {ns_leader}, writes

    # -- Proxies spread over both replicas -------------------------------------------------------
    backends: dict[str, Backend] = {n: ("127.0.0.1", mp.grpc_port) for n, mp in replicas.items()}
    balancer = TcpBalancer("127.0.0.1", list(backends.values())).start()
    try:
        target = f"127.0.0.1:{balancer.port}"
        envoys = []
        for i in range(2):
            envoys.append(
                await asyncio.to_thread(
                    mesh.sidecar, f"envoy-{i}", f"127.0.77.{i + 1}", namespace=APPS, xds_port=balancer.port
                )
            )
        proxies = [Proxy(target, i) for i in range(RECORDERS)]
        for proxy in proxies:
            await proxy.connect()
        where = served_by(replicas)
        ids = [p.id for p in proxies] + [f"envoy-{i}.{APPS}" for i in range(2)]
        assert sorted(where) == sorted(ids), where
        per_replica = {n: sorted(p for p, r in where.items() if r == n) for n in replicas}
        assert all(len(v) == len(ids) // 2 for v in per_replica.values()), per_replica  # round-robin
        assert all(any(p.startswith("envoy-") for p in v) for v in per_replica.values()), per_replica
        # The same model on every replica: the same bytes for every proxy, nothing empty.
        reference = proxies[0].held()
        assert all(reference[t] for t in (TypeUrl.CLUSTER, TypeUrl.LISTENER, TypeUrl.ENDPOINT)), reference
        for proxy in proxies:
            assert proxy.held() == reference, f"{proxy.id} ({where[proxy.id]}) differs from {proxies[0].id}"
        before = {p.id: p.held() for p in proxies}
        envoy_before = {}
        for i, envoy in enumerate(envoys):
            await asyncio.to_thread(
                eventually, lambda i=i: acked_on(replicas[where[f"envoy-{i}.{APPS}"]], f"envoy-{i}.{APPS}")
            )
            envoy_before[i] = envoy_resources(envoy)
            assert envoy_before[i], "Envoy holds config"

        # -- The status leader dies --------------------------------------------------------------
        victim = status_leader
        survivor = next(n for n in replicas if n != victim)
        orphans = [p for p in proxies if where[p.id] == victim]
        orphan_envoys = [i for i in range(2) if where[f"envoy-{i}.{APPS}"] == victim]
        victim_process = replicas[victim].proc
        assert victim_process is not None

        def since_kill(check: Any, timeout: float, what: str) -> float:
            eventually(check, timeout=timeout, interval=0.05, what=what)
            return time.monotonic() - killed

        async def reconnect(proxy: Proxy) -> tuple[float, float]:
            """The stream breaks; the proxy connects again through the balancer (to the survivor)."""
            assert await proxy.broken(timeout=10), f"{proxy.id}: its stream to the killed replica ended"
            broke = time.monotonic() - killed
            await proxy.close()
            await proxy.connect()
            return broke, time.monotonic() - killed

        victim_process.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        # The orphans read their streams from now: their end is timed as it comes, not after what follows.
        reconnecting = asyncio.gather(*(reconnect(p) for p in orphans))
        try:
            await asyncio.to_thread(victim_process.wait, 5)
            # A change only status follows (no proxy sees that VirtualService): the survivor writes it
            # once it leads, never before.
            await asyncio.to_thread(api.apply, other_virtual_service("b"))
        except BaseException:
            reconnecting.cancel()  # not left reading streams the teardown closes
            raise
        watched = asyncio.gather(
            asyncio.to_thread(since_kill, lambda: holder(api, STATUS_LEASE) == survivor, 15, STATUS_LEASE),
            asyncio.to_thread(
                since_kill,
                lambda: holder(api, NAMESPACE_CONTROLLER_LEASE) == survivor,
                15,
                NAMESPACE_CONTROLLER_LEASE,
            ),
            asyncio.to_thread(since_kill, lambda: observed(api, "elsewhere", "other") == 2, 15, "status"),
            *(
                asyncio.to_thread(
                    since_kill, lambda i=i: acked_on(replicas[survivor], f"envoy-{i}.{APPS}"), 20, "Envoy"
                )
                for i in orphan_envoys
            ),
        )
        reconnects = await reconnecting
        status_lease, ns_lease, status_written, *envoy_acked = await watched
        timings["streams to the killed replica ended (s)"] = max(broke for broke, _ in reconnects)
        # Its push workers stop with it and end their streams at once, rather than drain them for
        # the grace period (2 s) from a model nothing keeps current. (Under the grace, with room for a
        # busy host: the workers see their supervisor's pipe close, and the balancer relays the end.)
        assert timings["streams to the killed replica ended (s)"] < 1.5, timings
        # Each simulated proxy reads until 0.5 s pass without a response: that wait is included.
        timings["simulated proxies reconnected and converged (s)"] = max(done for _, done in reconnects)
        timings["Envoy reconnected and acked (s)"] = max(envoy_acked)
        timings["status Lease taken over (s)"] = status_lease
        if ns_leader == victim:
            timings["namespace-controller Lease taken over (s)"] = ns_lease
        timings["status written by the new leader (s)"] = status_written
        for proxy in orphans:
            assert proxy.held() == before[proxy.id], f"{proxy.id}: not what it had before"
        for i in orphan_envoys:
            await asyncio.to_thread(
                eventually, lambda i=i: envoy_resources(envoys[i]) == envoy_before[i], timeout=10
            )
            assert envoys[i].stats().get("control_plane.connected_state") == 1
        assert served_by(replicas) == dict.fromkeys(ids, survivor), "every proxy on the survivor"
        # Not before the lease duration (less the retry period the last renewal may have been earlier).
        assert status_lease > LEASE * 3 / 4, status_lease
        lease_obj = api.get("leases", ISTIO_NS, STATUS_LEASE)
        assert lease_obj is not None
        acquired = lease_obj["spec"]["acquireTime"]
        # The new namespace controller makes the ConfigMap of a namespace made now.
        api.apply(namespace("late"))
        configmap = await asyncio.to_thread(
            eventually, lambda: api.get("configmaps", "late", ROOT_CERT_CONFIGMAP), timeout=15, what="late"
        )
        assert configmap["data"][ROOT_CERT_KEY] == root
        writes = audit(audit_log)
        survivor_status = [
            e for e in writes if e["resource"] == "virtualservices/status" and e["user"] == survivor
        ]
        assert survivor_status, "the survivor wrote status once it led"
        assert all(e["at"] >= acquired for e in survivor_status), (acquired, survivor_status)
        late = [e for e in writes if e["resource"] == "configmaps" and e["name"].startswith("late/")]
        assert {e["user"] for e in late} == {survivor}, late

        # -- A third replica joins ---------------------------------------------------------------
        joined = time.monotonic()
        third = start("istiod-c")
        replicas["istiod-c"] = third
        await asyncio.to_thread(third.wait_ready, 60)
        timings["third replica ready (s)"] = time.monotonic() - joined
        balancer.set_backends([backends[survivor], ("127.0.0.1", third.grpc_port)])  # its endpoint, ready
        newcomers = [Proxy(target, RECORDERS + i) for i in range(4)]
        for proxy in newcomers:
            await proxy.connect()
        where = served_by(replicas)
        on_third = [p.id for p in newcomers if where.get(p.id) == "istiod-c"]
        assert len(on_third) == 2, where
        for proxy in newcomers:
            assert proxy.held() == reference, f"{proxy.id} ({where[proxy.id]}) differs"
        # The live leader keeps its Leases; the newcomer writes nothing.
        await asyncio.sleep(2 * LEASE / 4)
        assert holder(api, STATUS_LEASE) == survivor and holder(api, NAMESPACE_CONTROLLER_LEASE) == survivor
        assert not [e for e in audit(audit_log) if e["user"] == "istiod-c"]
        for proxy in proxies + newcomers:
            await proxy.close()

        # -- The leader stops cleanly (SIGTERM): it releases its Leases, the third leads at once -----
        stopping = time.monotonic()
        assert await asyncio.to_thread(replicas[survivor].stop) == 0
        for lease in (STATUS_LEASE, NAMESPACE_CONTROLLER_LEASE):
            assert f"lease {ISTIO_NS}/{lease}: released" in replicas[survivor].log()
            await asyncio.to_thread(
                eventually, lambda lease=lease: holder(api, lease) == "istiod-c", timeout=LEASE, what=lease
            )
        timings["clean stop: both Leases with the third replica (s, from SIGTERM)"] = (
            time.monotonic() - stopping
        )
        api.apply(namespace("later"))
        await asyncio.to_thread(
            eventually, lambda: api.get("configmaps", "later", ROOT_CERT_CONFIGMAP), timeout=15, what="later"
        )
        later = [e for e in audit(audit_log) if e["name"].startswith("later/")]
        assert {e["user"] for e in later} == {"istiod-c"}, later
    finally:
        balancer.close()
    timings_text = json.dumps({k: round(v, 2) for k, v in timings.items()})
    print(f"replica timings (status leader {status_leader}, namespace leader {ns_leader}): {timings_text}")
