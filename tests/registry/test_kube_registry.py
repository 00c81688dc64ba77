"""The Kubernetes registry: services and endpoints from core objects, whatever order they arrive in."""

from __future__ import annotations

from typing import Any

from support.kube import endpoint_slice, pod, service
from support.updater import Updater

from meshpilot.config.decode import decode_object
from meshpilot.model.kind import Kind
from meshpilot.model.protocol import Protocol
from meshpilot.model.proxy import NodeMetadata, parse_proxy
from meshpilot.model.push_request import TriggerReason
from meshpilot.model.service import Resolution
from meshpilot.registry.kube.controller import KubeRegistry

HOST = "reviews.default.svc.cluster.local"


def apply(registry: KubeRegistry, *docs: dict[str, Any]) -> None:
    for doc in docs:
        registry.upsert(decode_object(doc).obj)  # type: ignore[arg-type]


def node(name: str, region: str, zone: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"topology.kubernetes.io/region": region, "topology.kubernetes.io/zone": zone},
        },
    }


def test_service_conversion() -> None:
    updater = Updater()
    registry = KubeRegistry(updater)
    apply(
        registry,
        service(
            "reviews",
            "default",
            "10.0.0.1",
            [("http", 9080), ("grpc-api", 9090), ("mysql", 3306), ("", 53), ("weird", 8000)],
            {"app": "reviews"},
        ),
    )
    svc = registry.get_service(HOST)
    assert svc is not None
    assert svc.default_address == "10.0.0.1"
    assert [p.protocol for p in svc.ports] == [
        Protocol.HTTP,
        Protocol.GRPC,
        Protocol.MYSQL,
        Protocol.TCP,
        Protocol.UNSUPPORTED,
    ]
    assert svc.resolution is Resolution.CLIENT_SIDE_LB
    assert updater.services == [(HOST, False)]
    apply(registry, service("db", "default", "None", [("tcp", 5432)]))
    headless = registry.get_service("db.default.svc.cluster.local")
    assert headless is not None and headless.resolution is Resolution.PASSTHROUGH and headless.is_headless
    apply(
        registry,
        service("ext", "default", "", [("http", 80)], type="ExternalName", externalName="example.com"),
    )
    alias = registry.get_service("ext.default.svc.cluster.local")
    assert alias is not None and alias.resolution is Resolution.ALIAS and alias.mesh_external


def test_endpoints_carry_pod_identity_tls_mode_and_node_locality() -> None:
    updater = Updater()
    registry = KubeRegistry(updater)
    labeled = pod(
        "reviews-1",
        "default",
        "10.1.0.1",
        {"app": "reviews", "security.istio.io/tlsMode": "istio"},
        service_account="bookinfo-reviews",
        node="n1",
    )
    apply(
        registry,
        node("n1", "us-east", "us-east-1a"),
        service("reviews", "default", "10.0.0.1", [("http", 9080)]),
        labeled,
        endpoint_slice("reviews-x", "default", "reviews", [("http", 9080)], [("reviews-1", "10.1.0.1")]),
    )
    [ep] = updater.endpoints[HOST]
    assert (ep.address, ep.port, ep.service_port_name) == ("10.1.0.1", 9080, "http")
    assert ep.service_account == "spiffe://cluster.local/ns/default/sa/bookinfo-reviews"
    assert ep.tls_mode == "istio"
    assert ep.locality.label == "us-east/us-east-1a/"
    assert ep.labels["topology.kubernetes.io/zone"] == "us-east-1a"
    assert ep.labels["topology.istio.io/cluster"] == "Kubernetes"


def test_slice_before_service_and_pod_after_slice() -> None:
    updater = Updater()
    registry = KubeRegistry(updater)
    apply(
        registry,
        endpoint_slice("reviews-x", "default", "reviews", [("http", 9080)], [("reviews-1", "10.1.0.1")]),
    )
    # No Service yet: nothing reported (the same whether the objects come one by one or in a batch).
    assert HOST not in updater.endpoints
    apply(registry, service("reviews", "default", "10.0.0.1", [("http", 9080)]))
    assert updater.endpoints[HOST] == [], "the endpoint waits for its pod"
    apply(registry, pod("reviews-1", "default", "10.1.0.1", {"app": "reviews"}, service_account="r"))
    [ep] = updater.endpoints[HOST]
    assert ep.service_account == "spiffe://cluster.local/ns/default/sa/r"
    registry.remove(Kind.POD, "default", "reviews-1")
    assert updater.endpoints[HOST] == []


def test_several_slices_make_one_endpoint_list_and_readiness_is_kept() -> None:
    updater = Updater()
    registry = KubeRegistry(updater)
    apply(
        registry,
        service("reviews", "default", "10.0.0.1", [("http", 9080)]),
        pod("a", "default", "10.1.0.1", {}),
        pod("b", "default", "10.1.0.2", {}),
    )
    apply(registry, endpoint_slice("s1", "default", "reviews", [("http", 9080)], [("a", "10.1.0.1")]))
    second = endpoint_slice("s2", "default", "reviews", [("http", 9080)], [("b", "10.1.0.2")])
    second["endpoints"][0]["conditions"] = {"ready": False, "terminating": True}
    apply(registry, second)
    addresses = {(e.address, e.health.name) for e in updater.endpoints[HOST]}
    assert addresses == {("10.1.0.1", "HEALTHY"), ("10.1.0.2", "TERMINATING")}
    registry.remove(Kind.ENDPOINT_SLICE, "default", "s1")
    assert [e.address for e in updater.endpoints[HOST]] == ["10.1.0.2"]


def test_proxy_lookup_labels_and_service_targets() -> None:
    updater = Updater()
    registry = KubeRegistry(updater)
    apply(
        registry,
        node("n1", "eu", "eu-1"),
        service("reviews", "default", "10.0.0.1", [("http", 9080)], {"app": "reviews"}),
        pod("reviews-1", "default", "10.1.0.1", {"app": "reviews", "version": "v1"}, node="n1"),
    )
    by_name = parse_proxy(
        "sidecar~10.9.9.9~reviews-1.default~default.svc.cluster.local",
        NodeMetadata.parse({"NAMESPACE": "default"}),
    )
    assert registry.workload_labels(by_name) == {"app": "reviews", "version": "v1"}
    by_ip = parse_proxy(
        "sidecar~10.1.0.1~unknown.default~default.svc.cluster.local",
        NodeMetadata.parse({"NAMESPACE": "default"}),
    )
    assert registry.workload_labels(by_ip) == {"app": "reviews", "version": "v1"}
    assert registry.proxy_locality(by_ip) == "eu/eu-1/"
    [target] = registry.service_targets(by_ip)
    assert (target.service.hostname, target.port.port, target.target_port) == (HOST, 9080, 9080)
    apply(registry, pod("reviews-1", "default", "10.1.0.1", {"app": "reviews", "version": "v2"}, node="n1"))
    assert updater.proxies == ["10.1.0.1"], "a label change of a proxy's pod is a proxy update"


def test_service_targets_follow_service_and_pod_changes() -> None:
    """Targets are kept per Pod between pushes; any service or pod change must show."""
    registry = KubeRegistry(Updater())
    apply(
        registry,
        service("reviews", "default", "10.0.0.1", [("http", 9080)], {"app": "reviews"}),
        pod("reviews-1", "default", "10.1.0.1", {"app": "reviews"}),
    )
    proxy = parse_proxy(
        "sidecar~10.1.0.1~reviews-1.default~default.svc.cluster.local",
        NodeMetadata.parse({"NAMESPACE": "default"}),
    )

    def targets() -> list[tuple[str, int]]:
        return sorted((t.service.hostname, t.port.port) for t in registry.service_targets(proxy))

    assert targets() == [(HOST, 9080)]
    apply(
        registry,
        service("reviews", "default", "10.0.0.1", [("http", 9080), ("grpc", 7070)], {"app": "reviews"}),
    )
    assert targets() == [(HOST, 7070), (HOST, 9080)]
    apply(registry, service("other", "default", "10.0.0.2", [("http", 80)], {"tier": "web"}))
    assert targets() == [(HOST, 7070), (HOST, 9080)]
    apply(registry, pod("reviews-1", "default", "10.1.0.1", {"app": "reviews", "tier": "web"}))
    assert targets() == [("other.default.svc.cluster.local", 80), (HOST, 7070), (HOST, 9080)]
    registry.remove(Kind.SERVICE, "default", "reviews")
    assert targets() == [("other.default.svc.cluster.local", 80)]
    registry.remove(Kind.POD, "default", "reviews-1")
    assert targets() == []


def test_endpoints_found_by_ip_follow_their_pod_and_indexes_shrink_on_churn() -> None:
    updater = Updater()
    registry = KubeRegistry(updater)
    apply(registry, service("reviews", "default", "10.0.0.1", [("http", 9080)]))
    for round_ in range(3):
        slice_ = endpoint_slice("s", "default", "reviews", [("http", 9080)], [("p", "10.1.0.1")])
        del slice_["endpoints"][0]["targetRef"]  # matched to its pod by IP
        apply(registry, slice_)
        assert updater.endpoints[HOST][0].service_account == ""
        apply(registry, pod("p", "default", "10.1.0.1", {"round": str(round_)}, service_account="r"))
        [ep] = updater.endpoints[HOST]
        assert ep.service_account == "spiffe://cluster.local/ns/default/sa/r"
        assert ep.labels["round"] == str(round_)
        registry.remove(Kind.ENDPOINT_SLICE, "default", "s")
        registry.remove(Kind.POD, "default", "p")
        assert updater.endpoints[HOST] == []
    # Nothing is remembered for objects that are gone.
    assert not registry._by_pod and not registry._by_ip and not registry._by_node


def test_a_batch_computes_each_service_once_with_the_same_result() -> None:
    """Pods applied after their slice in one batch: one endpoint report per service, not one per pod."""
    docs = [
        service("reviews", "default", "10.0.0.1", [("http", 9080)], {"app": "reviews"}),
        endpoint_slice(
            "s", "default", "reviews", [("http", 9080)], [(f"p{i}", f"10.1.0.{i}") for i in range(1, 51)]
        ),
        *[
            pod(f"p{i}", "default", f"10.1.0.{i}", {"app": "reviews"}, service_account="r")
            for i in range(1, 51)
        ],
    ]
    plain, batched = Updater(), Updater()
    apply(KubeRegistry(plain), *docs)
    registry = KubeRegistry(batched)
    with registry.batch():
        apply(registry, *docs)
        assert batched.eds_calls == 0, "nothing is computed inside the batch"
    assert batched.eds_calls == 1
    assert plain.eds_calls > 50
    assert batched.endpoints[HOST] == plain.endpoints[HOST]
    assert all(ep.service_account.endswith("/sa/r") for ep in batched.endpoints[HOST])


def test_a_service_deleted_in_a_batch_reports_no_endpoints() -> None:
    updater = Updater()
    registry = KubeRegistry(updater)
    with registry.batch():
        apply(
            registry,
            service("reviews", "default", "10.0.0.1", [("http", 9080)], {"app": "reviews"}),
            endpoint_slice("s", "default", "reviews", [("http", 9080)], [("p1", "10.1.0.1")]),
        )
        registry.remove(Kind.SERVICE, "default", "reviews")
    assert HOST not in updater.endpoints


def test_headless_tcp_services_push_config_when_their_addresses_change() -> None:
    """Their listeners follow the endpoint addresses (istiod's HeadlessEndpointUpdate).

    HTTP-only headless services share the wildcard listener, so EDS is enough for them.
    """
    for ports, pushes in (([("tcp-db", 5432)], 1), ([("http", 80)], 0)):
        updater = Updater()
        registry = KubeRegistry(updater)
        apply(
            registry,
            service("db", "default", "None", ports, {"app": "db"}),
            pod("db-0", "default", "10.1.0.5", {"app": "db"}),
            pod("db-1", "default", "10.1.0.6", {"app": "db"}),
            endpoint_slice("db-a", "default", "db", ports, [("db-0", "10.1.0.5")]),
        )
        updater.requests.clear()
        apply(
            registry,
            endpoint_slice("db-a", "default", "db", ports, [("db-0", "10.1.0.5"), ("db-1", "10.1.0.6")]),
        )
        assert [(r.full, sorted(r.reasons)) for r in updater.requests] == [
            (True, [TriggerReason.HEADLESS_ENDPOINT])
        ] * pushes, ports
        updater.requests.clear()
        apply(registry, pod("db-1", "default", "10.1.0.6", {"app": "db", "version": "v2"}))
        assert updater.requests == [], "same addresses: EDS is enough"


def test_proxies_are_looked_up_in_their_own_cluster() -> None:
    """Two clusters reuse a pod IP (overlapping pod CIDRs): each proxy gets its own cluster's workload."""
    from meshpilot.model.identity import same_objects
    from meshpilot.registry.aggregate import AggregateRegistry

    east, west = KubeRegistry(Updater(), cluster_id="east"), KubeRegistry(Updater(), cluster_id="west")
    apply(east, pod("ratings-1", "default", "10.1.0.1", {"app": "ratings"}))
    apply(west, pod("reviews-1", "default", "10.1.0.1", {"app": "reviews"}))
    aggregate = AggregateRegistry([east, west], [])

    def proxy(cluster: str) -> Any:
        return parse_proxy(
            "sidecar~10.1.0.1~unknown.default~default.svc.cluster.local",
            NodeMetadata.parse({"NAMESPACE": "default", "CLUSTER_ID": cluster}),
        )

    assert aggregate.workload_labels(proxy("east")) == {"app": "ratings"}
    assert aggregate.workload_labels(proxy("west")) == {"app": "reviews"}
    # A cluster no registry has: looked up everywhere (the first registry that knows it).
    assert aggregate.workload_labels(proxy("elsewhere")) == {"app": "ratings"}

    # What a refresh compares to know the labels unchanged: the registries asked, and what each read.
    east_inputs, west_inputs = (
        aggregate.workload_inputs(proxy("east")),
        aggregate.workload_inputs(proxy("west")),
    )
    everywhere = aggregate.workload_inputs(proxy("elsewhere"))
    assert east_inputs[0] is east and west not in east_inputs
    assert west_inputs[0] is west and east not in west_inputs
    assert everywhere == east_inputs + west_inputs
    # West's Pod replaced: the inputs of the proxies that read it change, east's do not.
    apply(west, pod("reviews-1", "default", "10.1.0.1", {"app": "reviews", "version": "v2"}))
    assert same_objects(aggregate.workload_inputs(proxy("east")), east_inputs)
    assert not same_objects(aggregate.workload_inputs(proxy("west")), west_inputs)
    assert not same_objects(aggregate.workload_inputs(proxy("elsewhere")), everywhere)


def test_a_resync_keeps_the_unchanged_service_object() -> None:
    # Snapshots tell unchanged services by identity (shared outputs, kept listener keys).
    updater = Updater()
    registry = KubeRegistry(updater)
    apply(registry, service("reviews", "default", "10.0.0.1", [("http", 9080)], {"app": "reviews"}))
    before = registry.get_service(HOST)
    updates = len(updater.services)
    apply(registry, service("reviews", "default", "10.0.0.1", [("http", 9080)], {"app": "reviews"}))
    assert registry.get_service(HOST) is before
    assert len(updater.services) == updates, "nothing changed: no service update"
    apply(registry, service("reviews", "default", "10.0.0.1", [("http", 9081)], {"app": "reviews"}))
    after = registry.get_service(HOST)
    assert after is not before and after is not None and after.ports[0].port == 9081
