"""Delta xDS with a real Envoy (``api_type: DELTA_GRPC``): removals, reconnects, NACKs; and SotW still routes.

Every other integration test's Envoy speaks delta already (pilot-agent's default). This module shows
what only delta does: a deleted service's cluster leaves Envoy; an Envoy whose stream breaks reconnects
with the versions it holds and is sent nothing it already has; a config Envoy rejects leaves the last
good one in place. One Envoy on state-of-the-world routes the same traffic, so SotW stays shown.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from integration.conftest import MeshHarness
from support.kube import egress_sidecar, istio, workload
from support.processes import Envoy, backend_name
from support.tcp_balancer import TcpBalancer
from support.wait import eventually

pytestmark = [pytest.mark.envoy, pytest.mark.integration]

CLIENT_IP = "127.0.0.61"
EGRESS = "127.0.1.61"
REVIEWS = ("127.0.0.62", 9080)
RATINGS = ("127.0.0.63", 9080)
REVIEWS_CLUSTER = "outbound|9080||reviews.default.svc.cluster.local"
RATINGS_CLUSTER = "outbound|9080||ratings.default.svc.cluster.local"


def _apps(*, ratings: bool = True) -> list[dict[str, object]]:
    docs = [
        *workload("productpage", "default", "10.96.0.60", 9080, {"productpage-v1": CLIENT_IP}),
        *workload("reviews", "default", "10.96.0.62", 9080, {"reviews-v1": REVIEWS[0]}),
        egress_sidecar("productpage", EGRESS),
    ]
    if ratings:
        docs += workload("ratings", "default", "10.96.0.63", 9080, {"ratings-v1": RATINGS[0]})
    return docs


class Delta:
    def __init__(self, mesh: MeshHarness, envoy: Envoy, relay: TcpBalancer) -> None:
        self.mesh = mesh
        self.envoy = envoy
        self.relay = relay

    def kept(self) -> float:
        assert self.mesh.meshpilot is not None
        return self.mesh.meshpilot.metric('meshpilot_xds_delta_resources_kept{type="cds"}')


@pytest.fixture
def delta(mesh: MeshHarness) -> Iterator[Delta]:
    mesh.write("apps.yaml", _apps())
    mesh.backend("reviews-v1", *REVIEWS)
    mesh.backend("ratings-v1", *RATINGS)
    meshpilot = mesh.start_meshpilot()
    relay = TcpBalancer("127.0.0.1", [("127.0.0.1", meshpilot.grpc_port)]).start()
    try:
        envoy = mesh.sidecar("productpage-v1", CLIENT_IP, labels={"app": "productpage"}, xds_port=relay.port)
        eventually(lambda: backend_name(EGRESS, "ratings")[1] == "ratings-v1", what="ratings routed")
        yield Delta(mesh, envoy, relay)
    finally:
        relay.close()


def test_a_deleted_service_leaves_envoy(delta: Delta) -> None:
    assert RATINGS_CLUSTER in delta.envoy.dynamic_clusters()
    removed = delta.envoy.stats().get("cluster_manager.cluster_removed", 0)
    delta.mesh.write("apps.yaml", _apps(ratings=False))
    eventually(lambda: RATINGS_CLUSTER not in delta.envoy.dynamic_clusters(), what="ratings' cluster removed")
    assert delta.envoy.stats()["cluster_manager.cluster_removed"] == removed + 1
    assert REVIEWS_CLUSTER in delta.envoy.dynamic_clusters()
    assert backend_name(EGRESS, "reviews")[1] == "reviews-v1"
    assert not delta.envoy.rejected_updates()


def test_a_reconnect_is_sent_nothing_it_holds(delta: Delta) -> None:
    stats = delta.envoy.stats()
    clusters = len(delta.envoy.dynamic_clusters())
    kept = delta.kept()
    assert delta.relay.cut() > 0
    # Envoy reconnects with initial_resource_versions: every cluster it holds is left out of the answer.
    eventually(lambda: sum(delta.relay.accepted.values()) >= 2, what="Envoy reconnected")
    eventually(lambda: delta.kept() >= kept + clusters, what="the reconnect's CDS answered with nothing")
    after = delta.envoy.stats()
    rebuilt = (
        "cluster_manager.cluster_added",
        "cluster_manager.cluster_modified",
        "listener_manager.listener_modified",
    )
    for counter in rebuilt:
        assert after.get(counter, 0) == stats.get(counter, 0), f"{counter}: nothing was rebuilt"
    assert backend_name(EGRESS, "ratings")[1] == "ratings-v1"
    # And the stream still carries changes.
    delta.mesh.write("apps.yaml", _apps(ratings=False))
    eventually(
        lambda: RATINGS_CLUSTER not in delta.envoy.dynamic_clusters(), what="a change after the reconnect"
    )


def test_a_rejected_cluster_keeps_the_last_good_config(delta: Delta) -> None:
    assert delta.mesh.meshpilot is not None
    # Envoy caps a ring at 8M entries; Istio's validation (and meshpilot's) does not, so this
    # DestinationRule is accepted and the cluster it makes is refused by Envoy: a real NACK.
    ring = {"httpHeaderName": "x-user", "ringHash": {"minimumRingSize": 10_000_000}}
    delta.mesh.write(
        "dr.yaml",
        [
            istio(
                "DestinationRule",
                "reviews",
                "default",
                {
                    "host": "reviews",
                    "trafficPolicy": {"loadBalancer": {"consistentHash": ring}},
                },
            )
        ],
    )
    meshpilot = delta.mesh.meshpilot
    eventually(lambda: meshpilot.metric('pilot_total_xds_rejects{type="cds"}') >= 1, what="the NACK counted")
    assert delta.envoy.rejected_updates(), "Envoy rejected the update"
    assert backend_name(EGRESS, "reviews")[1] == "reviews-v1", "the last good cluster still routes"
    synced = meshpilot.get_json("/debug/syncz")
    errors = [
        r["lastError"] for entry in synced for r in entry.get("resources", {}).values() if r.get("lastError")
    ]
    assert any("ring" in e.lower() for e in errors), errors


def test_state_of_the_world_still_routes(mesh: MeshHarness) -> None:
    mesh.write("apps.yaml", _apps())
    mesh.backend("reviews-v1", *REVIEWS)
    mesh.backend("ratings-v1", *RATINGS)
    mesh.start_meshpilot()
    envoy = mesh.sidecar("productpage-v1", CLIENT_IP, labels={"app": "productpage"}, delta=False)
    eventually(lambda: backend_name(EGRESS, "reviews")[1] == "reviews-v1", what="reviews routed over SotW")
    mesh.write("apps.yaml", _apps(ratings=False))
    eventually(lambda: RATINGS_CLUSTER not in envoy.dynamic_clusters(), what="ratings gone over SotW")
    assert not envoy.rejected_updates()


def test_a_reconnect_to_a_restarted_server_is_sent_nothing_it_holds(delta: Delta) -> None:
    """Versions are hashes of the bytes, the same in every process: a new server process (or another
    replica) recognises what the proxy kept."""
    old = delta.mesh.meshpilot
    assert old is not None
    clusters = len(delta.envoy.dynamic_clusters())
    stats = delta.envoy.stats()
    # The new process is up and the relay sends to it before the old one goes: otherwise Envoy's
    # reconnects meet a closed port while the new one starts, and its backoff outgrows the wait.
    restarted = delta.mesh.start_meshpilot()
    delta.relay.set_backends([("127.0.0.1", restarted.grpc_port)])
    old.stop()
    delta.relay.cut()
    eventually(lambda: delta.kept() >= clusters, what="the new server left out every cluster Envoy holds")
    after = delta.envoy.stats()
    for counter in ("cluster_manager.cluster_added", "cluster_manager.cluster_modified"):
        assert after.get(counter, 0) == stats.get(counter, 0), f"{counter}: nothing was rebuilt"
    assert backend_name(EGRESS, "ratings")[1] == "ratings-v1"
