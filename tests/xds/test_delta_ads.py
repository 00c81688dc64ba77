"""Delta ADS as istiod serves it, driven by a real gRPC client against a real server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.route.v3 import route_pb2
from envoy.service.discovery.v3 import discovery_pb2
from support.ads_client import DeltaClient, lost_status
from support.kube import istio, write
from support.xds_server import NODE, Server, apps, three_services

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
LDS = "type.googleapis.com/envoy.config.listener.v3.Listener"
RDS = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
REVIEWS = "outbound|9080||reviews.default.svc.cluster.local"
RATINGS = "outbound|9080||ratings.default.svc.cluster.local"


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    async with three_services(tmp_path) as served:
        yield served


def names(response: discovery_pb2.DeltaDiscoveryResponse) -> list[str]:
    return [r.name for r in response.resources]


async def synced(server: Server, node: str = NODE) -> tuple[DeltaClient, dict[str, dict[str, str]]]:
    """A client holding CDS, EDS (reviews, ratings), LDS and RDS (9080), as Envoy subscribes; and the
    versions it holds, by type."""
    client = server.delta_client()
    held: dict[str, dict[str, str]] = {}

    async def take(type_url: str) -> None:
        response = await client.recv()
        assert response.type_url == type_url
        held.setdefault(type_url, {}).update({r.name: r.version for r in response.resources})
        client.ack(response)

    client.send(CDS, node_id=node)
    await take(CDS)
    client.send(EDS, [REVIEWS, RATINGS])
    await take(EDS)
    client.send(LDS)
    await take(LDS)
    client.send(RDS, ["9080"])
    await take(RDS)
    assert await client.no_response(0.3), "ACKs are not answered"
    return client, held


async def test_wildcard_cds_carries_versions_and_an_ack_is_quiet(server: Server) -> None:
    client = server.delta_client()
    client.send(CDS, node_id=NODE)
    first = await client.recv()
    assert first.type_url == CDS and first.nonce and first.system_version_info
    clusters = {r.name: cluster_pb2.Cluster.FromString(r.resource.value) for r in first.resources}
    assert REVIEWS in clusters and "BlackHoleCluster" in clusters
    assert all(r.version for r in first.resources), "every resource has a version"
    assert all(clusters[r.name].name == r.name for r in first.resources)
    assert not first.removed_resources
    client.ack(first)
    assert await client.no_response()
    conn = next(iter(server.app.server.connections.values()))
    assert conn.protocol == "delta" and conn.watched[CDS].nonce_acked == first.nonce
    await client.close()


async def test_explicit_subscriptions_send_only_what_is_added(server: Server) -> None:
    client = server.delta_client()
    client.send(EDS, [REVIEWS], node_id=NODE)
    first = await client.recv()
    assert names(first) == [REVIEWS]
    cla = endpoint_pb2.ClusterLoadAssignment.FromString(first.resources[0].resource.value)
    assert [e.endpoint.address.socket_address.address for g in cla.endpoints for e in g.lb_endpoints] == [
        "127.0.0.21"
    ]
    client.ack(first)
    client.send(EDS, [RATINGS])
    second = await client.recv()
    assert names(second) == [RATINGS], "only the newly subscribed name"
    client.ack(second)
    client.send(EDS, unsubscribe=[REVIEWS])
    assert await client.no_response(), "an unsubscription needs no response"
    client.send(EDS, unsubscribe=["outbound|1||never.subscribed"])
    assert await client.no_response(), "unsubscribing what was never subscribed changes nothing"
    client.send(EDS, [REVIEWS])
    again = await client.recv()
    assert names(again) == [REVIEWS], "a name subscribed again is sent again"
    await client.close()


async def test_an_endpoint_change_sends_one_assignment(server: Server) -> None:
    client, _ = await synced(server)
    write(
        server.config_dir / "apps.yaml",
        apps({"reviews-v1": "127.0.0.21", "reviews-v2": "127.0.0.22"}),
    )
    pushed = await client.recv(10)
    assert pushed.type_url == EDS and names(pushed) == [REVIEWS], "only the assignment that changed"
    assert not pushed.removed_resources
    client.ack(pushed)
    assert await client.no_response(0.5), "nothing else changed"
    await client.close()


async def test_proxies_pushed_the_same_change_share_one_response(server: Server) -> None:
    # Two sidecars of one namespace: one push gives both the same bytes, nonce included
    # (xds/responses.py). Endpoint pushes share one snapshot: a change and its revert are the same
    # content as the first push, yet each push draws its own nonce, so a late ACK of the first
    # cannot pass for an ACK of the third.
    other = "sidecar~127.0.0.12~client-0.default~default.svc.cluster.local"
    (first, _), (second, _) = await synced(server), await synced(server, other)
    two_endpoints = {"reviews-v1": "127.0.0.21", "reviews-v2": "127.0.0.22"}
    pushed = []
    for endpoints in (two_endpoints, {"reviews-v3": "127.0.0.23"}, two_endpoints):
        write(server.config_dir / "apps.yaml", apps(endpoints))
        one, two = await first.recv(10), await second.recv(10)
        assert one.type_url == EDS and names(one) == [REVIEWS]
        assert one.SerializeToString() == two.SerializeToString(), "one response for both proxies"
        first.ack(one)
        second.ack(two)
        pushed.append(one)
    assert len({p.nonce for p in pushed}) == 3, "a nonce per push, even for the same content again"
    assert (
        pushed[0].resources == pushed[2].resources
        and pushed[0].system_version_info == pushed[2].system_version_info
    )
    assert await first.no_response(0.3) and await second.no_response(0.3)
    acked = {c.proxy.id: c.watched[EDS].nonce_acked for c in server.app.server.connections.values()}
    assert set(acked.values()) == {pushed[2].nonce}, "both ACKs of the last push were taken as such"
    await asyncio.gather(first.close(), second.close())


async def test_a_virtual_service_change_sends_only_the_affected_routes(server: Server) -> None:
    client, held = await synced(server)
    write(
        server.config_dir / "vs.yaml",
        [
            istio(
                "VirtualService",
                "reviews",
                "default",
                {
                    "hosts": ["reviews"],
                    "http": [{"timeout": "3s", "route": [{"destination": {"host": "reviews"}}]}],
                },
            )
        ],
    )
    pushed = await client.recv(10)
    assert pushed.type_url == RDS and names(pushed) == ["9080"]
    assert pushed.resources[0].version != held[RDS]["9080"]
    rc = route_pb2.RouteConfiguration.FromString(pushed.resources[0].resource.value)
    reviews = next(v for v in rc.virtual_hosts if v.name.startswith("reviews."))
    assert reviews.routes[0].route.timeout.seconds == 3
    client.ack(pushed)
    assert await client.no_response(0.5), "clusters, endpoints and listeners did not change"
    await client.close()


async def test_a_deleted_service_is_removed(server: Server) -> None:
    client, _ = await synced(server)
    write(server.config_dir / "apps.yaml", apps(ratings=False))
    cds = await client.recv(10)
    assert cds.type_url == CDS and list(cds.removed_resources) == [RATINGS] and not cds.resources
    client.ack(cds)
    # As istiod, a subscribed assignment whose service is gone is sent empty (Envoy unsubscribes it
    # once the cluster is gone), and the route configuration loses its virtual host.
    by_type: dict[str, discovery_pb2.DeltaDiscoveryResponse] = {}
    while EDS not in by_type or RDS not in by_type:
        response = await client.recv(5)
        by_type[response.type_url] = response
        client.ack(response)
    assert names(by_type[EDS]) == [RATINGS]
    assert not endpoint_pb2.ClusterLoadAssignment.FromString(
        by_type[EDS].resources[0].resource.value
    ).endpoints
    rc = route_pb2.RouteConfiguration.FromString(by_type[RDS].resources[0].resource.value)
    assert not [v for v in rc.virtual_hosts if v.name.startswith("ratings.")]
    client.send(EDS, unsubscribe=[RATINGS])
    assert await client.no_response()
    await client.close()


async def test_a_reconnect_with_what_it_holds_is_sent_nothing_unchanged(server: Server) -> None:
    client, held = await synced(server)
    await client.close()
    kept = server.metric("meshpilot_xds_delta_resources_kept_total", type="cds")

    gone = "outbound|1||gone.default.svc.cluster.local"
    again = server.delta_client()
    again.send(CDS, node_id=NODE, initial={**held[CDS], gone: "0123456789abcdef"})
    response = await again.recv()
    assert response.type_url == CDS and not response.resources, "nothing it holds is sent again"
    assert list(response.removed_resources) == [gone], "what it holds that no longer exists is removed"
    assert server.metric("meshpilot_xds_delta_resources_kept_total", type="cds") == kept + len(held[CDS])
    again.ack(response)
    # One version it holds is out of date: exactly that assignment is answered.
    stale = {**held[EDS], REVIEWS: "0000000000000000"}
    again.send(EDS, [REVIEWS, RATINGS], initial=stale)
    eds = await again.recv()
    assert names(eds) == [REVIEWS] and not eds.removed_resources
    await again.close()


async def test_updated_clusters_get_their_endpoints_again(server: Server) -> None:
    client, _ = await synced(server)
    write(
        server.config_dir / "dr.yaml",
        [
            istio(
                "DestinationRule",
                "reviews",
                "default",
                {"host": "reviews", "trafficPolicy": {"loadBalancer": {"simple": "RANDOM"}}},
            )
        ],
    )
    cds = await client.recv(10)
    assert cds.type_url == CDS and names(cds) == [REVIEWS], "only the cluster that changed"
    eds = await client.recv(5)
    assert eds.type_url == EDS and names(eds) == [REVIEWS], "its unchanged assignment, for warming"
    client.ack(cds)
    client.ack(eds)
    await client.close()


async def test_a_nack_keeps_the_config_and_is_counted(server: Server) -> None:
    client = server.delta_client()
    client.send(CDS, node_id=NODE)
    first = await client.recv()
    client.send(CDS, nonce=first.nonce, error="bad cluster")
    assert await client.no_response()
    assert server.metric("pilot_total_xds_rejects_total", type="cds") == 1
    conn = next(iter(server.app.server.connections.values()))
    assert conn.watched[CDS].last_error == "bad cluster"
    await client.close()


async def test_a_stale_nonce_is_counted_but_its_subscription_still_counts(server: Server) -> None:
    client = server.delta_client()
    client.send(EDS, [REVIEWS], node_id=NODE)
    client.ack(await client.recv())
    client.send(EDS, nonce="from-the-past")
    assert await client.no_response()
    assert server.metric("pilot_xds_expired_nonce_total", type="eds") == 1
    client.send(EDS, [RATINGS], nonce="from-the-past")
    assert names(await client.recv()) == [RATINGS]
    await client.close()


async def test_unknown_types_are_refused_and_the_stream_lives_on(server: Server) -> None:
    client = server.delta_client()
    client.send("type.googleapis.com/no.such.Type", ["x"], node_id=NODE)
    assert await client.no_response()
    assert server.metric("meshpilot_xds_refused_requests_total", reason="unknown_type") == 1
    conn = next(iter(server.app.server.connections.values()))
    assert "type.googleapis.com/no.such.Type" not in conn.watched, "no state kept for it"
    client.send(CDS)
    assert (await client.recv()).type_url == CDS
    await client.close()


async def _refused(server: Server, send: list[bytes]) -> grpc.aio.AioRpcError:
    for _ in range(5):
        client = server.delta_client()
        for raw in send:
            client.send_raw(raw)
        try:
            while True:
                await client.recv()
        except grpc.aio.AioRpcError as err:
            if not lost_status(err):
                return err
        finally:
            await client.close()
    raise AssertionError("grpc.aio lost the server's status on every attempt")


def _request(type_url: str, subscribe: list[str], *, with_node: bool = False) -> bytes:
    from support.ads_client import node

    request = discovery_pb2.DeltaDiscoveryRequest(type_url=type_url, resource_names_subscribe=subscribe)
    if with_node:
        request.node.CopyFrom(node(NODE))
    return bytes(request.SerializeToString())


async def test_bad_requests_end_only_their_own_stream(server: Server) -> None:
    bystander, _ = await synced(server)

    huge_name = await _refused(server, [_request(EDS, ["x" * (1 << 20)], with_node=True)])
    assert huge_name.code() is grpc.StatusCode.INVALID_ARGUMENT and "resource name" in (
        huge_name.details() or ""
    )

    many = [f"outbound|{i}||s.default.svc.cluster.local" for i in range(100_000)]
    too_many = await _refused(server, [_request(EDS, many, with_node=True)])
    assert too_many.code() is grpc.StatusCode.RESOURCE_EXHAUSTED

    malformed = await _refused(server, [_request(CDS, [], with_node=True), b"\xff\xff\xff"])
    assert malformed.code() is grpc.StatusCode.INVALID_ARGUMENT and "malformed" in (malformed.details() or "")

    no_node = await _refused(server, [_request(CDS, [])])
    assert no_node.code() is grpc.StatusCode.INVALID_ARGUMENT

    # The other proxy still gets pushes.
    write(server.config_dir / "apps.yaml", apps(ratings=False))
    pushed = await bystander.recv(10)
    assert RATINGS in pushed.removed_resources
    await bystander.close()


async def test_both_protocols_share_one_server(server: Server) -> None:
    sotw = server.client()
    delta = server.delta_client()
    sotw.send(CDS, node_id=NODE)
    delta.send(CDS, node_id=NODE)
    sotw_clusters = {
        cluster_pb2.Cluster.FromString(r.value).name: r.value for r in (await sotw.recv()).resources
    }
    delta_clusters = {r.name: r.resource.value for r in (await delta.recv()).resources}
    assert sotw_clusters == delta_clusters, "the same bytes over both protocols"
    await asyncio.gather(sotw.close(), delta.close())


async def test_a_type_watched_after_earlier_pushes_is_pushed_too(server: Server) -> None:
    # A stream works out its push order once per set of watched types (Stream._push_order): a type
    # subscribed after that must still be pushed.
    client = server.delta_client()
    client.send(EDS, [REVIEWS], node_id=NODE)
    client.ack(await client.recv())
    write(server.config_dir / "apps.yaml", apps({"reviews-v1": "127.0.0.21", "reviews-v2": "127.0.0.22"}))
    pushed = await client.recv(10)
    assert pushed.type_url == EDS
    client.ack(pushed)
    client.send(CDS)
    answered = await client.recv(10)
    assert answered.type_url == CDS
    client.ack(answered)
    warmed = await client.recv(10)  # the assignment of a cluster just sent, again (Envoy warms it)
    assert warmed.type_url == EDS
    client.ack(warmed)
    assert await client.no_response(0.3)
    rule = {"host": "reviews", "trafficPolicy": {"connectionPool": {"tcp": {"maxConnections": 7}}}}
    write(server.config_dir / "dr.yaml", [istio("DestinationRule", "reviews", "default", rule)])
    pushed = await client.recv(10)
    assert pushed.type_url == CDS and REVIEWS in names(pushed), "the newly watched type is pushed"
    await client.close()
