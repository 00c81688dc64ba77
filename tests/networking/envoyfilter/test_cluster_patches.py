"""CLUSTER patches: match by name, service, port and subset; REMOVE, MERGE and ADD as istiod applies them."""

from __future__ import annotations

from typing import Any

from envoy.config.cluster.v3 import cluster_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2
from support.envoy_filters import as_dict, message, patch_set

from meshpilot.networking.envoyfilter import clusters
from meshpilot.networking.envoyfilter.patches import Context

REVIEWS = "outbound|9080|v1|reviews.default.svc.cluster.local"
OUT, IN, GW = Context.SIDECAR_OUTBOUND, Context.SIDECAR_INBOUND, Context.GATEWAY


def cluster(name: str, **fields: Any) -> Any:
    return message(cluster_pb2.Cluster, {"name": name, "type": "EDS", **fields})


def cluster_patch(
    operation: str, match: dict[str, Any] | None = None, value: Any = None, context: str = ""
) -> Any:
    patch: dict[str, Any] = {"applyTo": "CLUSTER", "patch": {"operation": operation}}
    if value is not None:
        patch["patch"]["value"] = value
    if match is not None or context:
        patch["match"] = {**({"context": context} if context else {}), "cluster": match or {}}
    return patch


def test_a_match_on_name_ignores_the_other_fields() -> None:
    patches = patch_set(cluster_patch("REMOVE", {"name": REVIEWS, "portNumber": 1}))
    assert clusters.patch_cluster(cluster(REVIEWS), patches, OUT) is None
    assert clusters.patch_cluster(cluster("outbound|9080|v2|reviews.default.svc.cluster.local"), patches, OUT)


def test_service_port_and_subset_are_read_from_the_cluster_name() -> None:
    wanted = {"service": "reviews.default.svc.cluster.local", "portNumber": 9080, "subset": "v1"}
    patches = patch_set(cluster_patch("MERGE", wanted, {"connect_timeout": "3s"}))
    assert clusters.touches(REVIEWS, patches, OUT)
    for other in (
        "outbound|9080|v2|reviews.default.svc.cluster.local",
        "outbound|9081|v1|reviews.default.svc.cluster.local",
        "outbound|9080|v1|ratings.default.svc.cluster.local",
        "BlackHoleCluster",
    ):
        assert not clusters.touches(other, patches, OUT), other
    merged = clusters.patch_cluster(cluster(REVIEWS, connect_timeout="10s"), patches, OUT)
    assert as_dict(merged)["connect_timeout"] == "3s"


def test_inbound_clusters_match_the_services_served_on_their_port() -> None:
    patches = patch_set(cluster_patch("REMOVE", {"service": "reviews.default.svc.cluster.local"}))
    assert clusters.touches("inbound|9080||", patches, IN, ("reviews.default.svc.cluster.local",))
    assert not clusters.touches("inbound|9080||", patches, IN, ("ratings.default.svc.cluster.local",))
    assert not clusters.touches("inbound|9080||", patches, IN)


def test_the_patch_context_must_match() -> None:
    patches = patch_set(cluster_patch("REMOVE", {"name": REVIEWS}, context="SIDECAR_INBOUND"))
    assert not clusters.touches(REVIEWS, patches, OUT)
    assert clusters.touches(REVIEWS, patches, IN)
    any_context = patch_set(cluster_patch("REMOVE", {"name": REVIEWS}))
    assert all(clusters.touches(REVIEWS, any_context, c) for c in (OUT, IN, GW))


def test_add_without_a_context_adds_on_the_outbound_side_and_on_gateways_only() -> None:
    value = {"name": "extra", "type": "STATIC", "connect_timeout": "1s"}
    patches = patch_set(cluster_patch("ADD", value=value))
    assert [c.name for c in clusters.added_clusters(patches, OUT)] == ["extra"]
    assert [c.name for c in clusters.added_clusters(patches, GW)] == ["extra"]
    assert clusters.added_clusters(patches, IN) == []
    inbound = patch_set(cluster_patch("ADD", value=value, context="SIDECAR_INBOUND"))
    assert [c.name for c in clusters.added_clusters(inbound, IN)] == ["extra"]
    # INSERT_* mean ADD for clusters.
    assert clusters.added_clusters(patch_set(cluster_patch("INSERT_FIRST", value=value)), OUT)


def test_added_clusters_are_copies() -> None:
    patches = patch_set(cluster_patch("ADD", value={"name": "extra"}))
    first = clusters.added_clusters(patches, OUT)[0]
    first.name = "changed"
    assert clusters.added_clusters(patches, OUT)[0].name == "extra"


def _tls(sni: str, name: str = "envoy.transport_sockets.tls") -> dict[str, Any]:
    return {
        "name": name,
        "typed_config": {
            "@type": "type.googleapis.com/" + tls_pb2.UpstreamTlsContext.DESCRIPTOR.full_name,
            "sni": sni,
        },
    }


def test_a_transport_socket_of_the_same_name_is_merged_and_nothing_else_is() -> None:
    base = cluster(REVIEWS, transport_socket=_tls("old"))
    patches = patch_set(
        cluster_patch("MERGE", {"name": REVIEWS}, {"transport_socket": _tls("new"), "connect_timeout": "9s"})
    )
    merged = as_dict(clusters.patch_cluster(base, patches, OUT))
    assert merged["transport_socket"]["typed_config"]["sni"] == "new"
    # istiod merges only the socket when the value has one.
    assert "connect_timeout" not in merged


def test_a_transport_socket_of_another_name_replaces_it() -> None:
    base = cluster(REVIEWS, transport_socket=_tls("old", name="other"))
    patches = patch_set(cluster_patch("MERGE", {"name": REVIEWS}, {"transport_socket": _tls("new")}))
    merged = as_dict(clusters.patch_cluster(base, patches, OUT))
    assert merged["transport_socket"]["name"] == "envoy.transport_sockets.tls"


def test_transport_socket_matches_without_that_socket_drop_the_patch() -> None:
    matches = [{"name": "tlsMode-istio", "transport_socket": _tls("old", name="mtls")}]
    other = patch_set(cluster_patch("MERGE", {"name": REVIEWS}, {"transport_socket": _tls("new")}))
    merged = as_dict(clusters.patch_cluster(cluster(REVIEWS, transport_socket_matches=matches), other, OUT))
    assert "transport_socket" not in merged
    assert merged["transport_socket_matches"][0]["transport_socket"]["typed_config"]["sni"] == "old"

    same = patch_set(
        cluster_patch("MERGE", {"name": REVIEWS}, {"transport_socket": _tls("new", name="mtls")})
    )
    merged = as_dict(clusters.patch_cluster(cluster(REVIEWS, transport_socket_matches=matches), same, OUT))
    assert merged["transport_socket_matches"][0]["transport_socket"]["typed_config"]["sni"] == "new"


def test_patches_apply_in_order() -> None:
    patches = patch_set(
        cluster_patch("MERGE", {"name": REVIEWS}, {"connect_timeout": "1s"}),
        cluster_patch("MERGE", {"name": REVIEWS}, {"connect_timeout": "2s"}),
    )
    assert as_dict(clusters.patch_cluster(cluster(REVIEWS), patches, OUT))["connect_timeout"] == "2s"
