"""The SotW ADS protocol as istiod speaks it, driven by a real gRPC client against a real server."""

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
from support.ads_client import ADS_METHOD, AdsClient, lost_status, node, refusal
from support.kube import istio, workload, write
from support.processes import free_port
from support.xds_server import NODE, Server, apps, running, settings_for, three_services

from meshpilot.server.app import DiscoveryApp
from meshpilot.server.settings import Address, DiscoverySettings

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


async def test_initial_request_ack_and_no_reply_to_ack(server: Server) -> None:
    client = server.client()
    client.send(CDS, node_id=NODE)
    first = await client.recv()
    assert first.type_url == CDS and first.nonce and first.version_info
    names = [cluster_pb2.Cluster.FromString(r.value).name for r in first.resources]
    assert REVIEWS in names and "BlackHoleCluster" in names
    assert len(names) == len(set(names)), "no duplicate names"
    client.ack(first)
    assert await client.no_response(), "an ACK of unchanged names gets no response"
    await client.close()


async def test_nack_keeps_config_counts_and_records_the_error(server: Server) -> None:
    client = server.client()
    client.send(CDS, node_id=NODE)
    first = await client.recv()
    client.send(CDS, nonce=first.nonce, version=first.version_info, error="bad cluster")
    assert await client.no_response(), "a NACK is not answered"
    assert server.metric("pilot_total_xds_rejects_total", type="cds") == 1
    conn = next(iter(server.app.server.connections.values()))
    assert conn.watched[CDS].last_error == "bad cluster"
    await client.close()


async def test_stale_nonce_is_ignored(server: Server) -> None:
    client = server.client()
    client.send(CDS, node_id=NODE)
    first = await client.recv()
    client.send(CDS, nonce="not-a-nonce-we-sent", version=first.version_info)
    assert await client.no_response()
    assert server.metric("pilot_xds_expired_nonce_total", type="cds") == 1
    await client.close()


async def test_eds_sends_added_names_only_and_empty_names_unsubscribe(server: Server) -> None:
    client = server.client()
    client.send(EDS, [REVIEWS], node_id=NODE)
    first = await client.recv()
    assert [endpoint_pb2.ClusterLoadAssignment.FromString(r.value).cluster_name for r in first.resources] == [
        REVIEWS
    ]
    client.ack(first, [REVIEWS, RATINGS])
    second = await client.recv()
    assert [
        endpoint_pb2.ClusterLoadAssignment.FromString(r.value).cluster_name for r in second.resources
    ] == [RATINGS], "only the added name is sent"
    client.ack(second, [RATINGS])
    assert await client.no_response(), "removing names needs no response"
    client.ack(second, [])
    assert await client.no_response(), "empty names unsubscribe"
    conn = next(iter(server.app.server.connections.values()))
    assert EDS not in conn.watched
    await client.close()


async def test_missing_names_are_answered_when_they_appear(server: Server) -> None:
    client = server.client()
    missing = "outbound|7000||details.default.svc.cluster.local"
    client.send(EDS, [missing], node_id=NODE)
    first = await client.recv()
    cla = endpoint_pb2.ClusterLoadAssignment.FromString(first.resources[0].value)
    assert cla.cluster_name == missing and not cla.endpoints
    client.ack(first, [missing])
    client.send(RDS, ["7000"], nonce="")
    routes = await client.recv()
    vhosts = [
        v.name for v in route_pb2.RouteConfiguration.FromString(routes.resources[0].value).virtual_hosts
    ]
    assert vhosts == ["allow_any"]
    client.ack(routes, ["7000"])

    write(
        server.config_dir / "details.yaml",
        workload("details", "default", "10.96.0.40", 7000, {"details-v1": "127.0.0.41"}),
    )
    pushed: dict[str, object] = {}
    while EDS not in pushed or RDS not in pushed:
        response = await client.recv(10)
        pushed[response.type_url] = response
        client.ack(response, [missing] if response.type_url == EDS else ["7000"])
    cla = endpoint_pb2.ClusterLoadAssignment.FromString(pushed[EDS].resources[0].value)  # type: ignore[attr-defined]
    addresses = [e.endpoint.address.socket_address.address for g in cla.endpoints for e in g.lb_endpoints]
    assert addresses == ["127.0.0.41"]
    rc = route_pb2.RouteConfiguration.FromString(pushed[RDS].resources[0].value)  # type: ignore[attr-defined]
    assert [v.name for v in rc.virtual_hosts] == ["details.default.svc.cluster.local:7000", "allow_any"]
    await client.close()


async def _synced(server: Server) -> AdsClient:
    client = server.client()
    client.send(CDS, node_id=NODE)
    client.ack(await client.recv())
    client.send(EDS, [REVIEWS])
    client.ack(await client.recv(), [REVIEWS])
    client.send(LDS)
    client.ack(await client.recv())
    client.send(RDS, ["9080"])
    client.ack(await client.recv(), ["9080"])
    assert await client.no_response(0.3)
    return client


async def test_proxies_pushed_the_same_change_share_one_response(server: Server) -> None:
    # As over delta (test_delta_ads): two sidecars given the same endpoint push get the same bytes.
    other = server.client()
    other.send(CDS, node_id="sidecar~127.0.0.12~client-0.default~default.svc.cluster.local")
    other.ack(await other.recv())
    other.send(EDS, [REVIEWS])
    other.ack(await other.recv(), [REVIEWS])
    first = await _synced(server)
    write(server.config_dir / "apps.yaml", apps({"reviews-v1": "127.0.0.21", "reviews-v2": "127.0.0.22"}))
    one, two = await first.recv(10), await other.recv(10)
    assert one.type_url == EDS and one.SerializeToString() == two.SerializeToString()
    first.ack(one, [REVIEWS])
    other.ack(two, [REVIEWS])
    assert await first.no_response(0.3) and await other.no_response(0.3)
    acked = {c.watched[EDS].nonce_acked for c in server.app.server.connections.values()}
    assert acked == {one.nonce}
    await asyncio.gather(first.close(), other.close())


async def _pushed_types(client: AdsClient, *, until: str) -> list[str]:
    """The types of the responses a push sends, in order, up to one of type ``until``; each ACKed
    with the names ``_synced`` watches."""
    order: list[str] = []
    while until not in order:
        response = await client.recv(10)
        order.append(response.type_url)
        client.ack(response, {EDS: [REVIEWS], RDS: ["9080"]}.get(response.type_url))
    return order


async def test_full_push_goes_out_in_cds_eds_lds_rds_order(server: Server) -> None:
    client = await _synced(server)
    # One change to every type: new services (CDS; a new port for LDS, a known one for
    # RDS) and a new reviews endpoint (EDS).
    write(
        server.config_dir / "apps.yaml",
        [
            *apps({"reviews-v1": "127.0.0.21", "reviews-v2": "127.0.0.22"}),
            *workload("details", "default", "10.96.0.40", 9080, {"details-v1": "127.0.0.41"}),
            *workload("extra", "default", "10.96.0.50", 7000, {"extra-v1": "127.0.0.51"}),
        ],
    )
    assert await _pushed_types(client, until=RDS) == [CDS, EDS, LDS, RDS]
    await client.close()


def _random_lb_rule(server: Server, host: str) -> None:
    """A DestinationRule that changes ``host``'s cluster and nothing else."""
    rule = {"host": host, "trafficPolicy": {"loadBalancer": {"simple": "RANDOM"}}}
    write(server.config_dir / "rule.yaml", [istio("DestinationRule", host, "default", rule)])


async def test_a_push_is_not_sent_to_a_proxy_that_holds_that_config(server: Server) -> None:
    client = await _synced(server)
    # A DestinationRule for ratings changes its cluster only: EDS, LDS and RDS come out the same.
    _random_lb_rule(server, "ratings")
    response = await client.recv(10)
    assert response.type_url == CDS
    clusters = {c.name: c for c in (cluster_pb2.Cluster.FromString(r.value) for r in response.resources)}
    assert clusters[RATINGS].lb_policy == cluster_pb2.Cluster.RANDOM
    client.ack(response)
    assert await client.no_response(0.5)
    for kind in ("eds", "lds", "rds"):
        assert server.metric("meshpilot_xds_unchanged_skipped_total", type=kind) == 1
    # Requests are always answered, unchanged or not.
    client.send(LDS, nonce="", version="")
    assert (await client.recv(10)).type_url == LDS
    await client.close()


async def test_after_a_cluster_push_the_same_eds_request_is_answered(server: Server) -> None:
    """Envoy re-requests the same endpoints for clusters it is warming; an unchanged ACK would stall them."""
    client = server.client()
    client.send(CDS, node_id=NODE)
    client.ack(await client.recv())
    client.send(EDS, [REVIEWS])
    endpoints = await client.recv()
    client.ack(endpoints, [REVIEWS])
    assert await client.no_response(0.3), "an unchanged EDS ACK is quiet"
    _random_lb_rule(server, "reviews")
    clusters = await client.recv(10)
    assert clusters.type_url == CDS
    # Envoy's order: the EDS request for the clusters it now warms, then the CDS ACK.
    client.send(EDS, [REVIEWS], nonce=endpoints.nonce, version=endpoints.version_info)
    client.ack(clusters)
    again = await client.recv(10)
    assert again.type_url == EDS
    assert [endpoint_pb2.ClusterLoadAssignment.FromString(r.value).cluster_name for r in again.resources] == [
        REVIEWS
    ]
    # Answered once: the ACK of that answer is quiet again.
    client.ack(again, [REVIEWS])
    assert await client.no_response(0.5)
    await client.close()


@pytest.mark.parametrize(
    ("node_id", "message"),
    [
        ("sidecar~127.0.0.1~pod.ns", "missing parts in the service node"),
        ("gateway~127.0.0.1~pod.ns~ns.svc.cluster.local", "invalid node type"),
        ("sidecar~not-an-ip~pod.ns~ns.svc.cluster.local", "no valid IP address"),
    ],
)
async def test_malformed_node_id_is_invalid_argument(server: Server, node_id: str, message: str) -> None:
    failure = await refusal(server.target, lambda client: client.send(CDS, node_id=node_id))
    assert failure.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (failure.details() or "")


async def test_first_request_without_node_is_invalid_argument(server: Server) -> None:
    failure = await refusal(server.target, lambda client: client.send(CDS))
    assert failure.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert failure.details() == "missing node information"


async def test_streams_are_refused_until_ready(tmp_path: Path) -> None:
    settings = DiscoverySettings(config_dir=None, grpc_addr=Address("127.0.0.1", free_port()))
    app = DiscoveryApp(settings)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([app.server.grpc_handler()])
    server.add_insecure_port(str(settings.grpc_addr))
    await server.start()
    try:
        failure = await refusal(str(settings.grpc_addr), lambda client: client.send(CDS, node_id=NODE))
        assert failure.code() == grpc.StatusCode.UNAVAILABLE
        assert failure.details() == "server is not ready to serve discovery information"
    finally:
        await server.stop(0)


async def test_vs_change_does_not_push_eds(server: Server) -> None:
    client = server.client()
    client.send(CDS, node_id=NODE)
    client.ack(await client.recv())
    client.send(EDS, [REVIEWS])
    client.ack(await client.recv(), [REVIEWS])
    write(
        server.config_dir / "vs.yaml",
        [
            istio(
                "VirtualService",
                "reviews",
                "default",
                {"hosts": ["reviews"], "http": [{"route": [{"destination": {"host": "ratings"}}]}]},
            )
        ],
    )
    # Clusters were generated again, came out the same and were not sent; EDS was not even generated.
    for _ in range(100):
        if server.metric("meshpilot_xds_unchanged_skipped_total", type="cds") == 1:
            break
        await asyncio.sleep(0.05)
    assert server.metric("meshpilot_xds_unchanged_skipped_total", type="cds") == 1
    assert await client.no_response(0.5), "a VirtualService change sends no EDS"
    assert server.metric("meshpilot_xds_unchanged_skipped_total", type="eds") == 0
    await client.close()


async def test_clients_vanishing_during_pushes_do_not_stall_the_others(tmp_path: Path) -> None:
    config = tmp_path / "config"
    write(
        config / "apps.yaml", workload("reviews", "default", "10.96.0.20", 9080, {"reviews-v1": "127.0.0.21"})
    )
    # One push at a time: a leaked push slot would stall every push after it.
    settings = settings_for(config, push_throttle=1)
    async with running(settings) as app:
        survivor = AdsClient(str(settings.grpc_addr))
        survivor.send(CDS, node_id=NODE)
        survivor.ack(await survivor.recv())
        for round_ in range(5):
            doomed = [AdsClient(str(settings.grpc_addr)) for _ in range(3)]
            for i, client in enumerate(doomed):
                client.send(
                    CDS, node_id=f"sidecar~127.0.0.{50 + i}~gone-{i}.default~default.svc.cluster.local"
                )
                await client.recv()
            write(
                config / f"svc-{round_}.yaml",
                workload(
                    f"svc{round_}", "default", f"10.96.1.{round_}", 8000, {f"p{round_}": f"127.0.2.{round_}"}
                ),
            )
            await asyncio.sleep(0.005)
            for client in doomed:
                await client.close()
            response = await survivor.recv(10)
            assert response.type_url == CDS
            names = [cluster_pb2.Cluster.FromString(r.value).name for r in response.resources]
            assert f"outbound|8000||svc{round_}.default.svc.cluster.local" in names
            survivor.ack(response)
        for _ in range(100):
            if len(app.server.connections) == 1:
                break
            await asyncio.sleep(0.02)
        assert len(app.server.connections) == 1, "closed streams are forgotten"
        await survivor.close()


async def test_new_streams_beyond_the_rate_get_resource_exhausted(tmp_path: Path) -> None:
    settings = settings_for(None, max_requests_per_second=1.0)
    async with running(settings) as app:
        clients = [AdsClient(str(settings.grpc_addr)) for _ in range(4)]
        for i, client in enumerate(clients):
            client.send(CDS, node_id=f"sidecar~127.0.0.{60 + i}~p{i}.default~default.svc.cluster.local")
        outcomes = []
        for client in clients:
            try:
                await client.recv(5)
                outcomes.append("served")
            except grpc.aio.AioRpcError as err:
                # A refusal whose status grpc.aio lost (see lost_status) is still a refusal: the
                # server's count below says which it was.
                outcomes.append("RESOURCE_EXHAUSTED" if lost_status(err) else err.code().name)
        # One token now, one within the one-second wait; the rest would wait longer.
        assert sorted(outcomes) == ["RESOURCE_EXHAUSTED", "RESOURCE_EXHAUSTED", "served", "served"]
        assert app.metrics.registry.get_sample_value("meshpilot_xds_rate_limited_total") == 2
        for client in clients:
            await client.close()


@pytest.mark.parametrize("first", [True, False], ids=["first-request", "later-request"])
async def test_malformed_request_is_invalid_argument(server: Server, first: bool) -> None:

    channel = grpc.aio.insecure_channel(server.target)
    call = channel.stream_stream(
        ADS_METHOD,
        request_serializer=lambda b: b,
        response_deserializer=discovery_pb2.DiscoveryResponse.FromString,
    )()
    if not first:
        request = discovery_pb2.DiscoveryRequest(type_url=CDS, node=node(NODE))
        await call.write(request.SerializeToString())
        assert (await call.read()).type_url == CDS
    await call.write(b"\x22\x05ab")  # type_url whose length runs past the end
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await call.read()
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed DiscoveryRequest" in (failure.value.details() or "")
    await channel.close()
    # The server keeps serving others.
    client = server.client()
    client.send(CDS, node_id=NODE)
    assert (await client.recv()).type_url == CDS
    await client.close()


async def test_types_watched_again_are_pushed_in_push_order(server: Server) -> None:
    # A stream works out its push order once per set of watched types (Stream._push_order): a type
    # dropped and watched again, and one watched later, are still pushed, clusters first.
    client = server.client()
    client.send(EDS, [REVIEWS], node_id=NODE)
    client.ack(await client.recv(), [REVIEWS])
    write(server.config_dir / "apps.yaml", apps({"reviews-v1": "127.0.0.21", "reviews-v2": "127.0.0.22"}))
    pushed = await client.recv(10)
    assert pushed.type_url == EDS
    client.ack(pushed, [])  # empty names: EDS is no longer watched
    assert await client.no_response(0.3)
    client.send(CDS, nonce="", version="")
    client.ack(await client.recv(10))
    client.send(EDS, [REVIEWS], nonce="", version="")
    client.ack(await client.recv(10), [REVIEWS])
    assert await client.no_response(0.3)
    write(
        server.config_dir / "apps.yaml",
        [
            *apps({"reviews-v1": "127.0.0.21", "reviews-v3": "127.0.0.23"}),
            *workload("details", "default", "10.96.0.40", 9080, {"details-v1": "127.0.0.41"}),
        ],
    )
    assert await _pushed_types(client, until=EDS) == [CDS, EDS]
    await client.close()
