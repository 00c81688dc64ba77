"""The EndpointIndex says what an endpoint update needs: no push, EDS only, or a full push."""

from __future__ import annotations

from meshpilot.model.endpoint import Endpoint
from meshpilot.model.endpoint_index import EndpointIndex, PushType, ShardKey

KUBE = ShardKey("Kubernetes", "Kubernetes")
REMOTE = ShardKey("west", "Kubernetes")
HOST = "reviews.default.svc.cluster.local"


def ep(ip: str, sa: str = "spiffe://cluster.local/ns/default/sa/reviews") -> Endpoint:
    return Endpoint(address=ip, port=9080, service_port_name="http", service_account=sa)


def test_new_service_needs_a_full_push_then_changes_are_incremental() -> None:
    index = EndpointIndex()
    assert index.update_service_endpoints(KUBE, HOST, "default", [ep("10.0.0.1")]) is PushType.FULL
    assert index.update_service_endpoints(KUBE, HOST, "default", [ep("10.0.0.1")]) is PushType.NO_PUSH
    assert index.update_service_endpoints(KUBE, HOST, "default", [ep("10.0.0.1"), ep("10.0.0.2")]) is (
        PushType.INCREMENTAL
    )


def test_a_changed_set_of_service_accounts_needs_a_full_push() -> None:
    index = EndpointIndex()
    index.update_service_endpoints(KUBE, HOST, "default", [ep("10.0.0.1")])
    result = index.update_service_endpoints(
        KUBE, HOST, "default", [ep("10.0.0.1"), ep("10.0.0.2", sa="spiffe://x")]
    )
    assert result is PushType.FULL
    shards = index.shards(HOST, "default")
    assert shards is not None
    assert shards.service_accounts == {"spiffe://cluster.local/ns/default/sa/reviews", "spiffe://x"}


def test_empty_update_removes_the_shard_but_keeps_the_service() -> None:
    index = EndpointIndex()
    index.update_service_endpoints(KUBE, HOST, "default", [ep("10.0.0.1")])
    index.update_service_endpoints(REMOTE, HOST, "default", [ep("10.1.0.1")])
    assert index.update_service_endpoints(REMOTE, HOST, "default", []) is PushType.INCREMENTAL
    shards = index.shards(HOST, "default")
    assert shards is not None and list(shards.shards) == [KUBE]
    # The service is still known, so new endpoints are not mistaken for a new service.
    assert index.update_service_endpoints(REMOTE, HOST, "default", [ep("10.1.0.2")]) is PushType.INCREMENTAL


def test_endpoints_iterate_in_sorted_shard_order() -> None:
    index = EndpointIndex()
    index.update_service_endpoints(REMOTE, HOST, "default", [ep("10.1.0.1")])
    index.update_service_endpoints(KUBE, HOST, "default", [ep("10.0.0.1")])
    shards = index.shards(HOST, "default")
    assert shards is not None
    assert [(str(k), e.address) for k, e in shards.endpoints()] == [
        ("Kubernetes/Kubernetes", "10.0.0.1"),
        ("Kubernetes/west", "10.1.0.1"),
    ]


def test_deleting_a_cluster_shard_reports_the_services_it_touched() -> None:
    index = EndpointIndex()
    index.update_service_endpoints(REMOTE, HOST, "default", [ep("10.1.0.1")])
    index.update_service_endpoints(REMOTE, "ratings.default.svc.cluster.local", "default", [ep("10.1.0.2")])
    index.update_service_endpoints(KUBE, HOST, "default", [ep("10.0.0.1")])
    touched = index.delete_shard(REMOTE)
    assert sorted(touched) == [("ratings.default.svc.cluster.local", "default"), (HOST, "default")]
    assert index.shards("ratings.default.svc.cluster.local", "default") is None
    remaining = index.shards(HOST, "default")
    assert remaining is not None and list(remaining.shards) == [KUBE]
