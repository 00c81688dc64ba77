"""KubeSource against an emulated API server over HTTP: lists, watches, reconnects, 410, filtering."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from support.kube import endpoint_slice, istio, namespace, pod, service
from support.kube_api import KubeApiServer
from support.updater import Updater

from meshpilot.config.store import ConfigStore
from meshpilot.kube.client import client_from_kubeconfig
from meshpilot.kube.metrics import KubeMetrics
from meshpilot.kube.source import KubeSource
from meshpilot.model.kind import Kind
from meshpilot.registry.kube.controller import KubeRegistry
from meshpilot.server.object_router import ObjectRouter

pytestmark = pytest.mark.integration


def node(name: str, zone: str) -> dict[str, Any]:
    labels = {"topology.kubernetes.io/region": "r1", "topology.kubernetes.io/zone": zone}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


VS_SPEC = {"hosts": ["web"], "http": [{"route": [{"destination": {"host": "web"}}]}]}
CONFIG_OBJECTS = [
    istio("VirtualService", "vs", "default", VS_SPEC),
    istio(
        "DestinationRule", "dr", "default", {"host": "web", "subsets": [{"name": "v1", "labels": {"v": "1"}}]}
    ),
    istio(
        "Gateway",
        "gw",
        "default",
        {"servers": [{"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}]},
    ),
    istio(
        "ServiceEntry",
        "se",
        "default",
        {
            "hosts": ["ext.example.com"],
            "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}],
            "resolution": "DNS",
        },
    ),
    istio("WorkloadEntry", "we", "default", {"address": "10.9.0.1", "labels": {"app": "vm"}}),
    istio("WorkloadGroup", "wg", "default", {"template": {"labels": {"app": "vm"}}}),
    istio("Sidecar", "sc", "default", {"egress": [{"hosts": ["./*"]}]}),
    istio("PeerAuthentication", "pa", "default", {"mtls": {"mode": "STRICT"}}, group="security"),
    istio("AuthorizationPolicy", "ap", "default", {"action": "ALLOW"}, group="security"),
    istio(
        "RequestAuthentication",
        "ra",
        "default",
        {"jwtRules": [{"issuer": "https://issuer.example.com"}]},
        group="security",
    ),
]
CONFIG_KINDS = [Kind(obj["kind"]) for obj in CONFIG_OBJECTS]


class Cluster:
    """An emulated API server and a KubeSource feeding a real ConfigStore and KubeRegistry."""

    def __init__(self, api: KubeApiServer, tmp: Path) -> None:
        self.api = api
        self.updater = Updater()
        self.store = ConfigStore()
        self.registry = KubeRegistry(self.updater)
        self.metrics = KubeMetrics.create(CollectorRegistry())
        self.client = client_from_kubeconfig(api.write_kubeconfig(tmp / "kubeconfig"))
        self.source = KubeSource(
            self.client, ObjectRouter(self.store, self.registry), metrics=self.metrics, watch_timeout=(30, 30)
        )

    def hosts(self) -> set[str]:
        return {s.hostname for s in self.registry.services()}

    def endpoint_ips(self, host: str) -> set[str]:
        return {ep.address for ep in self.updater.endpoints.get(host, [])}

    def localities(self, host: str) -> set[str]:
        return {ep.locality.label for ep in self.updater.endpoints.get(host, [])}

    def events(self, metric: str, type_: str, event: str) -> float:
        counter = self.metrics.registry_events if metric == "reg" else self.metrics.config_events
        value = counter.labels(type=type_, event=event)._value.get()
        return float(value)


async def until(check: Callable[[], Any], timeout: float = 10.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}: {value!r}")
        await asyncio.sleep(0.05)


@pytest.fixture
def api() -> Iterator[KubeApiServer]:
    with KubeApiServer() as server:
        yield server


@pytest.fixture
async def cluster(api: KubeApiServer, tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(api, tmp_path)
    yield c
    c.source.stop()
    c.client.close()


def web(ips: dict[str, str]) -> list[dict[str, Any]]:
    docs = [service("web", "default", "10.0.0.10", [("http", 80)], {"app": "web"})]
    docs += [pod(name, "default", ip, {"app": "web"}, node="n1") for name, ip in ips.items()]
    docs.append(endpoint_slice("web-1", "default", "web", [("http", 8080)], ips.items()))
    return docs


async def test_initial_list_of_every_kind(api: KubeApiServer, cluster: Cluster) -> None:
    for obj in [namespace("default"), node("n1", "z1"), *web({"web-a": "10.1.0.1"}), *CONFIG_OBJECTS]:
        api.apply(obj)
    cluster.source.start()
    await asyncio.wait_for(cluster.source.wait_synced(), 10)
    assert "web.default.svc.cluster.local" in cluster.hosts()
    assert cluster.endpoint_ips("web.default.svc.cluster.local") == {"10.1.0.1"}
    for kind in CONFIG_KINDS:
        assert len(cluster.store.configs(kind)) == 1, kind
    assert [ns.meta.name for ns in cluster.registry.namespaces()] == ["default"]
    assert cluster.events("reg", "Pods", "add") == 1
    assert cluster.events("cfg", "VirtualService", "add") == 1


async def test_add_update_delete_of_every_kind(api: KubeApiServer, cluster: Cluster) -> None:
    cluster.source.start()
    await asyncio.wait_for(cluster.source.wait_synced(), 10)
    for obj in [namespace("default"), node("n1", "z1"), *web({"web-a": "10.1.0.1"}), *CONFIG_OBJECTS]:
        api.apply(obj)
    await until(lambda: cluster.endpoint_ips("web.default.svc.cluster.local") == {"10.1.0.1"})
    await until(lambda: all(cluster.store.configs(k) for k in CONFIG_KINDS), what="every config kind")
    # Updates: the node's zone moves the endpoint's locality; each config gets a new label.
    api.apply(node("n1", "z2"))
    await until(
        lambda: cluster.localities("web.default.svc.cluster.local") == {"r1/z2/"}, what="the new zone"
    )
    for obj in CONFIG_OBJECTS:
        api.apply({**obj, "metadata": {**obj["metadata"], "labels": {"rev": "2"}}})
    await until(
        lambda: all(c.meta.labels.get("rev") == "2" for k in CONFIG_KINDS for c in cluster.store.configs(k))
    )
    api.apply(service("web", "default", "10.0.0.11", [("http", 80)], {"app": "web"}))
    await until(
        lambda: cluster.registry.get_service("web.default.svc.cluster.local").default_address == "10.0.0.11"
    )
    # Deletes.
    api.delete("endpointslices", "default", "web-1")
    await until(lambda: cluster.endpoint_ips("web.default.svc.cluster.local") == set())
    api.delete("pods", "default", "web-a")
    api.delete("services", "default", "web")
    await until(lambda: "web.default.svc.cluster.local" not in cluster.hosts())
    for obj in CONFIG_OBJECTS:
        plural = {"PeerAuthentication": "peerauthentications", "AuthorizationPolicy": "authorizationpolicies"}
        api.delete(plural.get(obj["kind"], obj["kind"]), "default", obj["metadata"]["name"])
    await until(lambda: not any(cluster.store.configs(k) for k in CONFIG_KINDS), what="configs deleted")
    api.delete("nodes", "", "n1")
    api.delete("namespaces", "", "default")
    await until(lambda: not cluster.registry.namespaces())
    assert cluster.events("reg", "Services", "delete") == 1
    assert cluster.events("reg", "Nodes", "update") == 1
    assert cluster.events("cfg", "Sidecar", "update") == 1
    assert cluster.events("cfg", "Sidecar", "delete") == 1


async def test_out_of_order_arrival(api: KubeApiServer, cluster: Cluster) -> None:
    """An EndpointSlice before its Service and its Pod: the endpoint appears once all have arrived."""
    cluster.source.start()
    await asyncio.wait_for(cluster.source.wait_synced(), 10)
    svc, pod_a, slice_ = web({"web-a": "10.1.0.1"})
    api.apply(slice_)
    await asyncio.sleep(0.3)
    assert "web.default.svc.cluster.local" not in cluster.hosts()
    api.apply(svc)
    await until(lambda: "web.default.svc.cluster.local" in cluster.hosts())
    await asyncio.sleep(0.3)
    # As istiod: an endpoint naming a Pod not seen yet waits for it, so it never has the wrong identity.
    assert cluster.endpoint_ips("web.default.svc.cluster.local") == set()
    api.apply(pod_a)
    await until(lambda: cluster.endpoint_ips("web.default.svc.cluster.local") == {"10.1.0.1"})
    (endpoint,) = cluster.updater.endpoints["web.default.svc.cluster.local"]
    assert endpoint.labels.get("app") == "web"
    assert endpoint.service_account == "spiffe://cluster.local/ns/default/sa/default"


async def test_reconnect_resumes_without_relisting(api: KubeApiServer, cluster: Cluster) -> None:
    for obj in web({"web-a": "10.1.0.1"}):
        api.apply(obj)
    cluster.source.start()
    await asyncio.wait_for(cluster.source.wait_synced(), 10)
    slices = next(i for i, k in cluster.source.informers.items() if k is Kind.ENDPOINT_SLICE)
    api.restart()  # every watch stream ends; the server comes back on the same port
    api.apply(pod("web-b", "default", "10.1.0.2", {"app": "web"}))
    api.apply(
        endpoint_slice(
            "web-1", "default", "web", [("http", 8080)], [("web-a", "10.1.0.1"), ("web-b", "10.1.0.2")]
        )
    )
    await until(lambda: cluster.endpoint_ips("web.default.svc.cluster.local") == {"10.1.0.1", "10.1.0.2"})
    assert slices.lists == 1, "a reconnect resumes the watch from its resourceVersion"
    assert slices.watches >= 2


async def test_expired_version_relists_and_reports_deletions(api: KubeApiServer, cluster: Cluster) -> None:
    for obj in [*web({"web-a": "10.1.0.1"}), CONFIG_OBJECTS[0]]:
        api.apply(obj)
    cluster.source.start()
    await asyncio.wait_for(cluster.source.wait_synced(), 10)
    vs = next(i for i, k in cluster.source.informers.items() if k is Kind.VIRTUAL_SERVICE)
    # Changes happen while meshpilot is cut off, then the history is compacted away: 410, relist.
    api.stop_listening()
    api.delete("virtualservices", "default", "vs")
    api.apply(istio("VirtualService", "vs2", "default", VS_SPEC))
    api.compact()
    api.start_listening()
    await until(lambda: [c.name for c in cluster.store.configs(Kind.VIRTUAL_SERVICE)] == ["vs2"], timeout=20)
    assert vs.lists >= 2
    assert cluster.events("cfg", "VirtualService", "delete") == 1


async def test_server_down_keeps_last_state_and_recovers(api: KubeApiServer, cluster: Cluster) -> None:
    for obj in web({"web-a": "10.1.0.1"}):
        api.apply(obj)
    cluster.source.start()
    await asyncio.wait_for(cluster.source.wait_synced(), 10)
    api.stop_listening()
    await asyncio.sleep(1.0)
    assert cluster.endpoint_ips("web.default.svc.cluster.local") == {"10.1.0.1"}, (
        "the last state keeps serving"
    )
    api.apply(pod("web-b", "default", "10.1.0.2", {"app": "web"}))
    api.apply(endpoint_slice("web-1", "default", "web", [("http", 8080)], [("web-b", "10.1.0.2")]))
    api.start_listening()
    await until(lambda: cluster.endpoint_ips("web.default.svc.cluster.local") == {"10.1.0.2"}, timeout=20)


async def test_invalid_object_rejected_and_last_valid_kept(api: KubeApiServer, cluster: Cluster) -> None:
    api.apply(CONFIG_OBJECTS[0])
    cluster.source.start()
    await asyncio.wait_for(cluster.source.wait_synced(), 10)
    bad = istio("VirtualService", "vs", "default", {"hosts": [], "http": [{"route": []}]})
    api.apply(bad)
    await until(lambda: cluster.source.rejections, what="a rejection")
    (rejection,) = cluster.source.rejections
    assert rejection.object == "VirtualService default/vs"
    assert "route" in rejection.reason
    (kept,) = cluster.store.configs(Kind.VIRTUAL_SERVICE)
    assert list(kept.spec.hosts) == ["web"]
    # Fixed again: the rejection goes away.
    api.apply(istio("VirtualService", "vs", "default", {**VS_SPEC, "hosts": ["web2"]}))
    await until(lambda: not cluster.source.rejections)
    assert [list(c.spec.hosts) for c in cluster.store.configs(Kind.VIRTUAL_SERVICE)] == [["web2"]]


async def test_discovery_selectors(api: KubeApiServer, cluster: Cluster) -> None:
    api.apply(namespace("default", mesh="on"))
    api.apply(namespace("other"))
    api.apply(service("a", "default", "10.0.0.1", [("http", 80)]))
    api.apply(service("b", "other", "10.0.0.2", [("http", 80)]))
    api.apply(istio("VirtualService", "vs-other", "other", VS_SPEC))
    cluster.source.set_discovery_selectors([{"matchLabels": {"mesh": "on"}}])
    cluster.source.start()
    await asyncio.wait_for(cluster.source.wait_synced(), 10)
    assert cluster.hosts() == {"a.default.svc.cluster.local"}
    assert cluster.store.configs(Kind.VIRTUAL_SERVICE) == []
    # Labelling the namespace brings its objects in; removing the label takes them out again.
    api.apply(namespace("other", mesh="on"))
    await until(lambda: cluster.hosts() == {"a.default.svc.cluster.local", "b.other.svc.cluster.local"})
    assert [c.name for c in cluster.store.configs(Kind.VIRTUAL_SERVICE)] == ["vs-other"]
    api.apply(namespace("other"))
    await until(lambda: cluster.hosts() == {"a.default.svc.cluster.local"})
    # Selectors removed: everything is discovered.
    cluster.source.set_discovery_selectors([])
    assert cluster.hosts() == {"a.default.svc.cluster.local", "b.other.svc.cluster.local"}


async def test_selectors_that_come_before_the_namespace_filter_objects_listed_earlier(
    api: KubeApiServer, cluster: Cluster
) -> None:
    # At start the lists race: the Services may come before the MeshConfig's selectors, and those
    # before the Namespace. Objects applied while nothing was selected are taken out when selectors
    # come, whether or not their Namespace was seen yet, and stay out when it comes unselected.
    api.apply(namespace("default", mesh="on"))
    api.apply(service("a", "default", "10.0.0.1", [("http", 80)]))
    api.apply(service("b", "other", "10.0.0.2", [("http", 80)]))
    cluster.source.start()
    await asyncio.wait_for(cluster.source.wait_synced(), 10)
    assert cluster.hosts() == {"a.default.svc.cluster.local", "b.other.svc.cluster.local"}
    cluster.source.set_discovery_selectors([{"matchLabels": {"mesh": "on"}}])
    assert cluster.hosts() == {"a.default.svc.cluster.local"}
    api.apply(namespace("other"))
    await until(lambda: cluster.events("reg", "Namespaces", "add") == 2, what="the Namespace seen")
    assert cluster.hosts() == {"a.default.svc.cluster.local"}
    api.apply(namespace("other", mesh="on"))
    await until(lambda: cluster.hosts() == {"a.default.svc.cluster.local", "b.other.svc.cluster.local"})


async def test_objects_held_back_before_their_namespace_is_listed_come_in_when_selectors_go(
    api: KubeApiServer, cluster: Cluster
) -> None:
    api.apply(namespace("default", mesh="on"))
    api.apply(service("a", "default", "10.0.0.1", [("http", 80)]))
    api.apply(service("b", "other", "10.0.0.2", [("http", 80)]))
    cluster.source.set_discovery_selectors([{"matchLabels": {"mesh": "on"}}])
    cluster.source.start()
    await asyncio.wait_for(cluster.source.wait_synced(), 10)
    # No Namespace "other" was listed: held back while selectors are set, and in once they are not.
    assert cluster.hosts() == {"a.default.svc.cluster.local"}
    cluster.source.set_discovery_selectors([])
    assert cluster.hosts() == {"a.default.svc.cluster.local", "b.other.svc.cluster.local"}


async def test_status_only_change_is_not_reapplied(api: KubeApiServer, cluster: Cluster) -> None:
    api.apply(CONFIG_OBJECTS[0])
    cluster.source.start()
    await asyncio.wait_for(cluster.source.wait_synced(), 10)
    events: list[object] = []
    cluster.store.add_handler(events.append)
    stored = api.get("virtualservices", "default", "vs")
    assert stored is not None
    api.apply({**stored, "status": {"observedGeneration": 1}})
    await asyncio.sleep(0.5)
    assert events == []


async def test_a_watch_refused_with_410_relists(api: KubeApiServer, cluster: Cluster) -> None:
    """410 as the watch request's own status (not an ERROR event) also means: list again."""
    for obj in web({"web-a": "10.1.0.1"}):
        api.apply(obj)
    cluster.source.start()
    await asyncio.wait_for(cluster.source.wait_synced(), 10)
    before = sum(informer.lists for informer in cluster.source.informers)
    api.fail_next(1, status=410)
    api.restart()  # every informer reconnects; the first to ask gets 410
    await until(lambda: sum(i.lists for i in cluster.source.informers) == before + 1, what="one relist")
    api.apply(pod("web-b", "default", "10.1.0.2", {"app": "web"}))
    api.apply(endpoint_slice("web-1", "default", "web", [("http", 8080)], [("web-b", "10.1.0.2")]))
    await until(lambda: cluster.endpoint_ips("web.default.svc.cluster.local") == {"10.1.0.2"})
