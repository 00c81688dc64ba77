"""Random change sequences, applied to a single process and, through the change log, to push-worker
replicas: the same bytes at every step (issue 20, "Shown: byte identity").

In one process, without ports: a ``Role.SINGLE`` app takes each change straight into its sink, as
``--push-workers 1`` does; a ``Role.MAIN`` app takes the same change through its own sink, which
records it in the change log (``LoggedSink``); ``Role.WORKER`` apps with a ``Replica`` subscribed to
that log apply every message as a worker process does, pickled and unpickled. Each step then pushes
as the debounce would (the single and the main process each push what their registries queued; the
main's push reaches the replicas as a ``Push``), and a few proxies' CDS, LDS, RDS and EDS are
generated from each app as a new stream is answered (the server's cache included) and compared
byte for byte, and each replica's snapshot version with the main process's.

Replicas subscribe at different moments: before anything (the live log only), after the first load
was applied but before ``Start``, and at a random step of the sequence (the snapshot of a running
server: a restarted worker).

The changes: Kubernetes Services, Pods and EndpointSlices; ServiceEntries (static and selecting
WorkloadEntries) and WorkloadEntries; VirtualServices, DestinationRules, a Gateway, a Sidecar,
PeerAuthentication and AuthorizationPolicy; MeshConfig; each an upsert of a random variant or a
removal, some steps in one batch (as a file edit is applied), some steps without a push (a proxy
that connects while the debounce waits).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import pickle
import random
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest
from google.protobuf import any_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.golden import agent_metadata
from support.kube import endpoint_slice, istio, pod, service
from support.pool_fetch import eds_clusters, route_names

from meshpilot.config.decode import decode_object
from meshpilot.config.file_source import ObjectSink
from meshpilot.kube.multicluster import registry_sink
from meshpilot.model.kind import Kind
from meshpilot.model.mesh import apply_mesh_config, default_mesh_config
from meshpilot.model.proxy import NodeMetadata, parse_proxy
from meshpilot.model.push_request import PushRequest, TriggerReason, merge_all
from meshpilot.pool import change_log
from meshpilot.pool.change_log import LoggedSink
from meshpilot.pool.replica import Replica
from meshpilot.registry.kube.controller import KubeRegistry
from meshpilot.server.app import DiscoveryApp
from meshpilot.server.object_router import ObjectRouter
from meshpilot.server.role import Role
from meshpilot.server.settings import DiscoverySettings
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.generators import GenerationContext
from meshpilot.xds.server import DiscoveryServer
from meshpilot.xds.types import TypeUrl

SETTINGS = DiscoverySettings(secure_grpc_addr=None, webhook_addr=None, push_workers=3)

# -- the objects: each name has variants, chosen by a seed ---------------------------------------

SERVICES = {"a": ("default", "10.96.0.1"), "b": ("default", "10.96.0.2"), "c": ("other", "10.96.0.3")}
PODS = {"a-0": "10.1.0.10", "a-1": "10.1.0.11", "b-0": "10.1.0.20", "c-0": "10.1.0.30"}
PORTS = [("http", 9080), ("grpc-api", 7070), ("tcp-db", 3306)]
A_HOST = "a.default.svc.cluster.local"


def _some(rng: random.Random, items: list[Any], least: int = 1) -> list[Any]:
    return rng.sample(items, rng.randint(least, len(items)))


def _service(name: str, rng: random.Random) -> dict[str, Any]:
    namespace, ip = SERVICES[name]
    return service(name, namespace, ip, _some(rng, PORTS), {"app": name})


def _pod(name: str, rng: random.Random) -> dict[str, Any]:
    app = name.split("-")[0]
    labels = {"app": app, "version": rng.choice(["v1", "v2"])}
    return pod(name, SERVICES[app][0], PODS[name], labels, service_account=rng.choice([app, "default"]))


def _slice(app: str, rng: random.Random) -> dict[str, Any]:
    pods = [(p, ip) for p, ip in PODS.items() if p.startswith(f"{app}-")]
    return endpoint_slice(f"{app}-slice", SERVICES[app][0], app, _some(rng, PORTS), _some(rng, pods, 0))


def _external(rng: random.Random) -> dict[str, Any]:
    resolution = rng.choice(["STATIC", "DNS", "NONE"])
    ports = [
        {"number": 80, "name": "http", "protocol": "HTTP"},
        {"number": 443, "name": "https", "protocol": "HTTPS"},
    ]
    hosts = ["ext.example.com"]
    if rng.random() < 0.5:
        hosts.append("ext2.example.com")
    else:
        # A TCP port takes one host (validation).
        ports.append({"number": 5000, "name": "tcp", "protocol": "TCP"})
    spec: dict[str, Any] = {
        "hosts": hosts,
        "location": rng.choice(["MESH_EXTERNAL", "MESH_INTERNAL"]),
        "resolution": resolution,
        "ports": _some(rng, ports),
    }
    if resolution == "STATIC":
        spec["endpoints"] = [
            {"address": ip, "labels": {"version": rng.choice(["v1", "v2"])}}
            for ip in _some(rng, ["10.2.0.1", "10.2.0.2", "10.2.0.3"])
        ]
    return istio("ServiceEntry", "ext", "default", spec)


def _selecting(rng: random.Random) -> dict[str, Any]:
    return istio(
        "ServiceEntry",
        "wl",
        "default",
        {
            "hosts": ["wl.internal"],
            "location": "MESH_INTERNAL",
            "resolution": "STATIC",
            "ports": [{"number": rng.choice([8080, 8081]), "name": "http", "protocol": "HTTP"}],
            "workloadSelector": {"labels": {"app": "wl"}},
        },
    )


def _workload_entry(name: str, rng: random.Random) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "address": {"we-0": "10.3.0.1", "we-1": "10.3.0.2"}[name],
        "labels": {"app": rng.choice(["wl", "other"]), "version": rng.choice(["v1", "v2"])},
    }
    if rng.random() < 0.5:
        spec["weight"] = rng.randint(1, 5)
    return istio("WorkloadEntry", name, "default", spec)


def _destination_rule(rng: random.Random) -> dict[str, Any]:
    return istio(
        "DestinationRule",
        "a",
        "default",
        {
            "host": A_HOST,
            "trafficPolicy": {
                "loadBalancer": {"simple": rng.choice(["ROUND_ROBIN", "LEAST_REQUEST", "RANDOM"])},
                "connectionPool": {"tcp": {"maxConnections": rng.randint(1, 500)}},
                "tls": {"mode": rng.choice(["ISTIO_MUTUAL", "DISABLE"])},
            },
            "subsets": [{"name": v, "labels": {"version": v}} for v in _some(rng, ["v1", "v2"])],
        },
    )


def _external_rule(rng: random.Random) -> dict[str, Any]:
    return istio(
        "DestinationRule",
        "ext",
        "default",
        {"host": "ext.example.com", "trafficPolicy": {"tls": {"mode": rng.choice(["SIMPLE", "DISABLE"])}}},
    )


def _virtual_service(rng: random.Random) -> dict[str, Any]:
    first = rng.randint(0, 100)
    route: dict[str, Any] = {
        "route": [
            {"destination": {"host": A_HOST, "subset": "v1"}, "weight": first},
            {"destination": {"host": A_HOST, "subset": "v2"}, "weight": 100 - first},
        ]
    }
    if rng.random() < 0.5:
        route["timeout"] = f"{rng.randint(1, 9)}s"
    if rng.random() < 0.5:
        route["match"] = [{"uri": {"prefix": rng.choice(["/api", "/v2"])}}]
    return istio("VirtualService", "a", "default", {"hosts": [A_HOST], "http": [route]})


def _cross_namespace(rng: random.Random) -> dict[str, Any]:
    return istio(
        "VirtualService",
        "c-retries",
        "default",
        {
            "hosts": ["c.other.svc.cluster.local"],
            "exportTo": [rng.choice([".", "*"])],
            "http": [
                {
                    "route": [{"destination": {"host": "c.other.svc.cluster.local"}}],
                    "retries": {"attempts": rng.randint(1, 5)},
                }
            ],
        },
    )


def _gateway(rng: random.Random) -> dict[str, Any]:
    return istio(
        "Gateway",
        "gw",
        "istio-system",
        {
            "selector": {"istio": "ingressgateway"},
            "servers": [
                {
                    "port": {"number": rng.choice([80, 8080]), "name": "http", "protocol": "HTTP"},
                    "hosts": _some(rng, ["*.example.com", "a.example.com"]),
                }
            ],
        },
    )


def _gateway_routes(rng: random.Random) -> dict[str, Any]:
    return istio(
        "VirtualService",
        "gw-routes",
        "istio-system",
        {
            "hosts": [rng.choice(["*.example.com", "a.example.com"])],
            "gateways": ["istio-system/gw"],
            "http": [{"route": [{"destination": {"host": A_HOST, "port": {"number": 9080}}}]}],
        },
    )


def _sidecar(rng: random.Random) -> dict[str, Any]:
    return istio("Sidecar", "default", "other", {"egress": [{"hosts": _some(rng, ["./*", "default/*"])}]})


def _peer_authentication(rng: random.Random) -> dict[str, Any]:
    mode = rng.choice(["STRICT", "PERMISSIVE", "DISABLE"])
    return istio("PeerAuthentication", "default", "default", {"mtls": {"mode": mode}}, group="security")


def _authorization(rng: random.Random) -> dict[str, Any]:
    return istio(
        "AuthorizationPolicy",
        "allow-a",
        "default",
        {
            "selector": {"matchLabels": {"app": "a"}},
            "action": rng.choice(["ALLOW", "DENY"]),
            "rules": [{"from": [{"source": {"namespaces": _some(rng, ["default", "other"])}}]}],
        },
        group="security",
    )


WEST = "west"
WEST_PODS = {"a-2": "10.5.0.1", "a-3": "10.5.0.2"}


def _west_pod(name: str, rng: random.Random) -> dict[str, Any]:
    labels = {"app": "a", "version": rng.choice(["v1", "v2"])}
    return pod(name, "default", WEST_PODS[name], labels, service_account="a")


def _west_slice(rng: random.Random) -> dict[str, Any]:
    pods = _some(rng, list(WEST_PODS.items()))
    return endpoint_slice("a-slice", "default", "a", _some(rng, PORTS), pods)


WEST_SERVICE = "west/service/a"
Make = Callable[[random.Random], dict[str, Any]]
#: Objects of the remote cluster WEST (service a's hostname has endpoints in both clusters), applied
#: while it is attached (it is from the start; "west", a Change of its own, detaches and attaches it).
#: Its Service comes and goes with it, so that its slice never outlives it
#: (``test_a_slice_whose_service_is_gone``).
REMOTE: dict[str, Make] = {
    WEST_SERVICE: partial(_service, "a"),
    **{f"west/pod/{n}": partial(_west_pod, n) for n in WEST_PODS},
    "west/slice/a": _west_slice,
}
OBJECTS: dict[str, Make] = {
    **REMOTE,
    **{f"service/{n}": partial(_service, n) for n in SERVICES},
    **{f"pod/{n}": partial(_pod, n) for n in PODS},
    **{f"slice/{n}": partial(_slice, n) for n in SERVICES},
    "se/ext": _external,
    "se/wl": _selecting,
    **{f"we/{n}": partial(_workload_entry, n) for n in ("we-0", "we-1")},
    "dr/a": _destination_rule,
    "dr/ext": _external_rule,
    "vs/a": _virtual_service,
    "vs/c-retries": _cross_namespace,
    "gw/gw": _gateway,
    "vs/gw-routes": _gateway_routes,
    "sidecar/other": _sidecar,
    "pa/default": _peer_authentication,
    "authz/allow-a": _authorization,
}
MESHES = [
    "",
    "enableAutoMtls: false",
    "outboundTrafficPolicy: {mode: REGISTRY_ONLY}",
    "defaultConfig: {holdApplicationUntilProxyStarts: true}",
]

# -- the proxies compared --------------------------------------------------------------------------

PROXIES: list[tuple[str, dict[str, Any]]] = [
    ("sidecar~10.1.0.10~a-0.default~default.svc.cluster.local", {"LABELS": {"app": "a", "version": "v1"}}),
    ("sidecar~10.1.0.30~c-0.other~other.svc.cluster.local", {"LABELS": {"app": "c"}}),
    (
        "router~10.1.0.100~gw-1.istio-system~istio-system.svc.cluster.local",
        {"LABELS": {"istio": "ingressgateway"}, "SERVICE_ACCOUNT": "istio-ingressgateway-service-account"},
    ),
]


def served(server: DiscoveryServer, node_id: str, metadata: dict[str, Any]) -> dict[TypeUrl, list[bytes]]:
    """The proxy's CDS, LDS, RDS (the listeners' names) and EDS (the EDS clusters), as a new stream of
    ``server`` is answered: from its snapshot, its endpoint index and its cache."""
    push = server.push_context
    assert push is not None
    proxy = parse_proxy(
        node_id, NodeMetadata.parse(agent_metadata(node_id, metadata)), default_cluster_id=server.cluster_id
    )
    server.refresh_proxy(proxy, push)
    request = PushRequest(full=True, reasons=Counter({TriggerReason.PROXY: 1}), push=push)
    generators = server.generators_for(proxy)
    ctx = GenerationContext(proxy, push, server.index, request, server.cache)

    def run(type_url: TypeUrl, names: set[str] | None) -> list[bytes]:
        watch = WatchedResource(type_url.value, frozenset(names or ()), wildcard=names is None)
        resources = generators[type_url].generate(ctx, watch, None if names is None else frozenset(names))
        return sorted(r.payload for r in resources or [])

    def unpacked(payloads: list[bytes]) -> list[bytes]:
        return [any_pb2.Any.FromString(p).value for p in payloads]

    clusters = run(TypeUrl.CLUSTER, None)
    listeners = run(TypeUrl.LISTENER, None)
    return {
        TypeUrl.CLUSTER: clusters,
        TypeUrl.LISTENER: listeners,
        TypeUrl.ROUTE: run(TypeUrl.ROUTE, route_names(unpacked(listeners))),
        TypeUrl.ENDPOINT: run(TypeUrl.ENDPOINT, eds_clusters(unpacked(clusters))),
    }


# -- one sequence ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    """An upsert of ``name``'s variant ``seed``, or (seed None) its removal; ``name`` "mesh": a
    MeshConfig (``seed`` picks one)."""

    name: str
    seed: int | None


@dataclass(frozen=True)
class Step:
    """Changes, inside ``batches`` nested batches (0 to 2: the second opens halfway, as another
    source's batch may open while a large file is applied in slices), then a push unless ``push`` is
    False. ``push_midway``: a push halfway, inside the batches (the debounce's maximum delay passing
    during a long batch)."""

    changes: tuple[Change, ...]
    batches: int = 0
    push: bool = True
    push_midway: bool = False


class Worker:
    """A push worker in this process: its app, its replica, and its subscription to the change log."""

    def __init__(self, main: DiscoveryApp) -> None:
        self.app = DiscoveryApp(SETTINGS, role=Role.WORKER)
        # The pipe to the main process carries only the worker's answers here (none are asked).
        self.pipe, _ = multiprocessing.Pipe()
        self.replica = Replica(self.app, self.pipe, multiprocessing.Value("i", 0))
        assert main.changes is not None
        # As the worker's reader thread does, minus the thread: every message unpickled, in order.
        main.changes.subscribe(lambda data: self.replica.apply(pickle.loads(data)))


def _decode(raw: dict[str, Any]) -> Any:
    return decode_object(raw).obj


def _remove(sink: ObjectSink, raw: dict[str, Any]) -> None:
    meta = raw["metadata"]
    sink.remove(Kind(raw["kind"]), meta["namespace"], meta["name"])


class Mesh:
    """The sequence's processes: the single one, the main one with its replicas."""

    def __init__(self) -> None:
        self.single = DiscoveryApp(SETTINGS, role=Role.SINGLE)
        self.main = DiscoveryApp(SETTINGS, role=Role.MAIN)
        assert self.main.changes is not None
        self.sinks: list[ObjectSink] = [
            ObjectRouter(self.single.store, self.single.kube, self.single.credentials),
            # The main process's sources write here (DiscoveryApp._router): its model and the log.
            self.main._router(),
        ]
        self.workers = [Worker(self.main)]
        #: Objects present, by name: the raw object (removals need its kind and key).
        self.present: dict[str, dict[str, Any]] = {}
        #: While WEST is attached: its registry in the single and the main process, and their sinks.
        self.west: list[KubeRegistry] = []
        self.west_sinks: list[ObjectSink] = []

    def apply(self, change: Change) -> None:
        if change.name == "mesh":
            text = MESHES[(change.seed or 0) % len(MESHES)]
            mesh = apply_mesh_config(text) if text else default_mesh_config()
            for app in (self.single, self.main):
                app.on_mesh(mesh)
            return
        if change.name == WEST:
            self.attach() if change.seed is not None else self.detach()
            return
        sinks = self.sinks
        if change.name in REMOTE:
            if not self.west:
                return
            sinks = self.west_sinks
        if change.seed is None:
            raw = self.present.pop(change.name, None)
            if raw is not None:
                for sink in sinks:
                    _remove(sink, raw)
            return
        raw = OBJECTS[change.name](random.Random(change.seed))
        self.present[change.name] = raw
        for sink in sinks:
            # Each process decodes its own copy, as each reads the file itself.
            sink.upsert(_decode(raw))

    def attach(self) -> None:
        """WEST joins, as a multicluster Secret adds it (the kube controller's attach, then its
        source's sink: in the main process, one that records)."""
        if self.west:
            return
        assert self.main.changes is not None
        self.west = [app.make_registry(WEST) for app in (self.single, self.main)]
        for app, registry in zip((self.single, self.main), self.west, strict=True):
            app._attach(registry)
        self.west_sinks = [
            registry_sink(self.west[0]),
            LoggedSink(registry_sink(self.west[1]), self.main.changes, WEST),
        ]
        self.apply(Change(WEST_SERVICE, 0))

    def detach(self) -> None:
        """WEST leaves: its source removes everything it had added, then the registry goes."""
        if not self.west:
            return
        for name in [n for n in self.present if n in REMOTE]:
            raw = self.present.pop(name)
            for sink in self.west_sinks:
                _remove(sink, raw)
        for app, registry in zip((self.single, self.main), self.west, strict=True):
            app._detach(registry)
        self.west, self.west_sinks = [], []

    @contextmanager
    def batch(self, on: bool = True) -> Iterator[None]:
        with ExitStack() as stack:
            if on:
                for sink in self.sinks:
                    stack.enter_context(sink.batch())
            yield

    def step(self, step: Step, join: int | None) -> None:
        """Apply ``step``; a worker subscribes before change ``join`` (None: none does)."""
        halfway = len(step.changes) // 2
        with ExitStack() as batches:
            if step.batches:
                batches.enter_context(self.batch())
            for index, change in enumerate(step.changes):
                if index == halfway:
                    if step.batches > 1:
                        batches.enter_context(self.batch())
                    if step.push_midway:
                        self.push()
                if index == join:
                    self.workers.append(Worker(self.main))
                self.apply(change)
        if join is not None and join >= len(step.changes):
            self.workers.append(Worker(self.main))
        if step.push:
            self.push()

    def load(self, changes: tuple[Change, ...]) -> None:
        """The first load: WEST attached, one batch, a replica subscribing meanwhile, then the first
        snapshot."""
        self.attach()
        with self.batch(True):
            for change in changes:
                self.apply(change)
        self.workers.append(Worker(self.main))
        for app in (self.single, self.main):
            asyncio.run(app.load())

    def push(self) -> None:
        """What the debounce would push now, in each process that debounces."""
        for app in (self.single, self.main):
            events = app.server._events  # the queue the debounce reads
            pending = [events.get_nowait() for _ in range(events.qsize())]
            if pending:
                app.server.start_push(merge_all(pending))

    def check(self, where: str) -> None:
        main_push = self.main.server.push_context
        assert main_push is not None
        for index, worker in enumerate(self.workers):
            push = worker.app.server.push_context
            assert push is not None, f"{where}: worker {index} has no snapshot"
            assert push.version == main_push.version, (
                f"{where}: worker {index} serves version {push.version}, the main process {main_push.version}"
            )
        for node_id, metadata in PROXIES:
            want = served(self.single.server, node_id, metadata)
            assert want[TypeUrl.LISTENER] or node_id.startswith("router"), f"{where}: no listeners"
            for index, worker in enumerate(self.workers):
                got = served(worker.app.server, node_id, metadata)
                differ = [t.short for t in want if want[t] != got[t]]
                assert not differ, (
                    f"{where}: worker {index} serves {node_id} other {differ} than a single process"
                )


def run(initial: tuple[Change, ...], steps: list[Step], late: tuple[int, int]) -> None:
    """``late``: (step, change) where a worker subscribes to the running server's log."""
    mesh = Mesh()
    mesh.load(initial)
    mesh.check("after the first load")
    for number, step in enumerate(steps):
        mesh.step(step, late[1] if number == late[0] % len(steps) else None)
        mesh.check(f"step {number} {step}")


# -- the property -----------------------------------------------------------------------------------

#: What a sequence changes (WEST's Service follows WEST).
CHANGED = sorted(set(OBJECTS) - {WEST_SERVICE})
#: Changed but never removed: an EndpointSlice whose Service is gone makes the registry's endpoints
#: depend on whether a batch was open (``test_a_slice_whose_service_is_gone``).
KEPT = frozenset(name for name in CHANGED if name.startswith("service/"))


def change(name: str, seed: int | None) -> Change:
    return Change(name, 0 if seed is None and name in KEPT else seed)


changes = st.one_of(
    st.builds(change, st.sampled_from(CHANGED), st.integers(0, 2**16) | st.none()),
    st.builds(Change, st.just("mesh"), st.integers(0, len(MESHES) - 1)),
    st.builds(Change, st.just(WEST), st.just(0) | st.none()),
)
steps = st.builds(
    Step,
    st.lists(changes, min_size=1, max_size=4).map(tuple),
    st.integers(0, 2),
    st.booleans() | st.just(True),
    st.booleans(),
)


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    # Each object in the first load or not, so that most runs start from a mesh where they meet.
    initial=st.fixed_dictionaries({name: st.integers(0, 2**16) | st.none() for name in CHANGED}).map(
        lambda seeds: tuple(Change(name, seed) for name, seed in seeds.items() if seed is not None)
    ),
    steps=st.lists(steps, min_size=1, max_size=12),
    late=st.tuples(st.integers(0, 11), st.integers(0, 4)),
)
def test_replicas_serve_the_bytes_of_a_single_process(
    initial: tuple[Change, ...], steps: list[Step], late: tuple[int, int]
) -> None:
    run(initial, steps, late)


@pytest.mark.parametrize("max_tail", [change_log.MAX_TAIL, 2], ids=["tail-kept", "tail-coalesced"])
def test_a_long_sequence_with_every_object(max_tail: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """One fixed, long sequence: every object several times, removals and mesh changes among them;
    once more with the change log's tail coalesced whenever it holds two ops (a late worker then
    gets each object's last change of a run only, and removals of objects it never had)."""
    monkeypatch.setattr(change_log, "MAX_TAIL", max_tail)
    rng = random.Random(20)
    names = CHANGED
    initial = tuple(Change(name, rng.randint(0, 2**16)) for name in names)
    sequence = []
    for _ in range(40):
        picked = [
            change(rng.choice([*names, "mesh", WEST]), rng.choice([None, rng.randint(0, 2**16)]))
            for _ in range(rng.randint(1, 4))
        ]
        sequence.append(Step(tuple(picked), rng.randint(0, 2), rng.random() < 0.8, rng.random() < 0.2))
    run(initial, sequence, late=(rng.randint(0, 39), rng.randint(0, 4)))


# -- the sequences that found bugs, kept ------------------------------------------------------------

EVERYTHING = tuple(Change(name, 1) for name in CHANGED)


def test_a_worker_that_joins_before_a_push_serves_that_push_s_state() -> None:
    """A worker restarted while the main process debounces a change: its first snapshot is the last
    push's, the change comes after (it once held the change under the last push's version)."""
    steps = [Step((Change("vs/a", 7),), push=False), Step((Change("pod/a-0", 3),), push=False)]
    run(EVERYTHING, steps, late=(1, 0))


def test_a_worker_that_joins_inside_a_batch() -> None:
    """A worker restarted while a file is applied in slices: the batch's end, which comes live, must
    close a batch open in the worker (it once ended the worker on a KeyError)."""
    changes = (Change("pod/a-0", 3), Change("slice/a", 4), Change("dr/a", 5))
    run(EVERYTHING, [Step(changes, batches=1)], late=(0, 1))


def test_nested_batches() -> None:
    """Another source's batch inside a file's (it once ended the worker on a KeyError), a push in the
    middle of the outer batch, and a worker joining inside the inner one."""
    changes = (Change("pod/a-0", 3), Change("slice/a", 4), Change("se/ext", 5), Change("we/we-0", 6))
    run(EVERYTHING, [Step(changes, batches=2, push_midway=True)], late=(0, 3))


def test_a_slice_whose_service_is_gone() -> None:
    """Service a removed, its EndpointSlice kept, then one of its pods changed outside a batch; a
    worker joins after that (WEST's Service a keeps the hostname and its clusters). The registry once
    reported the slice's endpoints outside a batch and dropped them inside one, so the late worker,
    which loads in a batch, served other endpoints."""
    steps = [
        Step((Change("service/a", None),), batches=1),
        Step((Change("pod/a-1", 40801),)),  # a pod the slice (variant 27348) names
        Step((Change("dr/a", 1),)),
    ]
    run((Change("service/a", 41830), Change("slice/a", 27348)), steps, late=(2, 0))


def test_a_worker_that_joins_after_a_coalesced_tail(monkeypatch: pytest.MonkeyPatch) -> None:
    """Changes that push nothing, the same objects changed and removed again and again: the tail the
    late worker gets holds each object's last change of a run only (and removals of objects it never
    had), yet it serves the same bytes."""
    monkeypatch.setattr(change_log, "MAX_TAIL", 2)
    steps = [
        Step((Change("pod/a-0", 3), Change("pod/a-0", 4), Change("vs/a", 1)), push=False),
        Step((Change("vs/a", None), Change("se/ext", 5), Change("vs/a", 8)), push=False),
        Step((Change("se/ext", None), Change("pod/a-0", None), Change("dr/a", 2)), push=False),
        Step((Change("dr/a", None), Change("pod/a-0", 6), Change("se/ext", 7)), push=False),
        Step((Change("vs/a", 9),)),
    ]
    run(EVERYTHING, steps, late=(3, 2))
