"""The fleet simulator over delta xDS: its requests, its handling of responses, and the report's columns.

Requests are checked by parsing them with protobuf; responses are built with
protobuf by hand, so these tests need no server.
"""

from __future__ import annotations

import time
from typing import Any

from envoy.config.core.v3 import config_source_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2

from bench import report_delta
from bench.fleet_delta import (
    DeltaProxy,
    apply_response,
    delta_ack_bytes,
    delta_request,
    follow_up,
    opening_requests,
)
from bench.fleet_run import FleetJob, median_round
from bench.run import FloorJob
from bench.scenario import Scenario
from bench.sidecar import CDS, EDS, LDS, RDS, ProxySpec
from bench.wirescan import delta_resource, listener_route_names, scan_delta_response

TCP_PROXY = "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy"
NODE_ID = "sidecar~10.0.0.1~a-0.ns~ns.svc.cluster.local"


def _parse(data: bytes) -> discovery_pb2.DeltaDiscoveryRequest:
    return discovery_pb2.DeltaDiscoveryRequest.FromString(data)


def _any(type_url: str, message: Any) -> any_pb2.Any:
    return any_pb2.Any(type_url=type_url, value=message.SerializeToString())


def _named(type_url: str, name: str) -> any_pb2.Any:
    """A resource whose field 1 is its name: a Cluster, a ClusterLoadAssignment or a RouteConfiguration."""
    return _any(type_url, route_pb2.RouteConfiguration(name=name))


def _hcm_filter(*, rds: str = "", inline: str = "") -> listener_components_pb2.Filter:
    manager = hcm.HttpConnectionManager(stat_prefix="x")
    if rds:
        manager.rds.CopyFrom(hcm.Rds(config_source=config_source_pb2.ConfigSource(), route_config_name=rds))
    else:
        manager.route_config.CopyFrom(route_pb2.RouteConfiguration(name=inline))
    return listener_components_pb2.Filter(
        name="envoy.filters.network.http_connection_manager",
        typed_config=_any(
            "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
            "HttpConnectionManager",
            manager,
        ),
    )


def _listener(name: str, *route_names: str, inline: bool = False, tcp: bool = False) -> any_pb2.Any:
    chains = [listener_components_pb2.FilterChain(filters=[_hcm_filter(rds=r)]) for r in route_names]
    if inline:
        chains.append(listener_components_pb2.FilterChain(filters=[_hcm_filter(inline="inbound|80||")]))
    if tcp:
        proxy = tcp_proxy_pb2.TcpProxy(stat_prefix="x", cluster="outbound|9000||a")
        tcp_filter = listener_components_pb2.Filter(
            name="envoy.filters.network.tcp_proxy",
            typed_config=_any(TCP_PROXY, proxy),
        )
        chains.append(listener_components_pb2.FilterChain(filters=[tcp_filter]))
    return _any(LDS, listener_pb2.Listener(name=name, filter_chains=chains))


def _response(
    type_url: str,
    resources: list[tuple[str, str, any_pb2.Any]],
    *,
    nonce: str = "n-1",
    removed: tuple[str, ...] = (),
    removed_names: tuple[str, ...] = (),
) -> bytes:
    response = discovery_pb2.DeltaDiscoveryResponse(
        system_version_info="2026-01-01T00:00:00Z/7",
        type_url=type_url,
        nonce=nonce,
        removed_resources=list(removed),
        resources=[discovery_pb2.Resource(name=n, version=v, resource=r) for n, v, r in resources],
    )
    for name in removed_names:
        response.removed_resource_names.add(name=name)
    data: bytes = response.SerializeToString()
    return data


def _clusters(*names: str) -> list[tuple[str, str, any_pb2.Any]]:
    return [(n, f"v-{n}", _named(CDS, n)) for n in names]


def _proxy() -> DeltaProxy:
    return DeltaProxy(ProxySpec(NODE_ID, {"NAMESPACE": "ns"}), ["8080"])


# -- requests --------------------------------------------------------------------------


def test_requests_are_what_protobuf_parses_and_acks_carry_only_the_nonce() -> None:
    node = ProxySpec(NODE_ID, {"NAMESPACE": "ns"}).node()
    first = _parse(delta_request(CDS, node=node.SerializeToString()))
    assert first.node.id == NODE_ID and first.type_url == CDS
    assert not first.resource_names_subscribe and not first.initial_resource_versions

    names = [f"outbound|80||svc-{i}.ns.svc.cluster.local" for i in range(50)]
    subscribe = delta_request(EDS, subscribe=names[:30], unsubscribe=names[30:])
    expected = discovery_pb2.DeltaDiscoveryRequest(
        type_url=EDS, resource_names_subscribe=names[:30], resource_names_unsubscribe=names[30:]
    )
    assert subscribe == expected.SerializeToString()

    ack = delta_request(EDS, nonce="v7-abc")
    expected = discovery_pb2.DeltaDiscoveryRequest(type_url=EDS, response_nonce="v7-abc")
    assert ack == expected.SerializeToString()
    assert len(ack) == delta_ack_bytes(EDS, "v7-abc") < 100

    resumed = _parse(delta_request(RDS, subscribe=["80"], initial_versions={"80": "abc", "90": ""}))
    assert dict(resumed.initial_resource_versions) == {"80": "abc", "90": ""}
    assert list(resumed.resource_names_subscribe) == ["80"]


# -- responses -------------------------------------------------------------------------


def test_delta_responses_are_scanned_as_protobuf_wrote_them() -> None:
    data = _response(
        CDS, _clusters("outbound|80||a", "outbound|80||b"), nonce="n-9", removed=("x",), removed_names=("y",)
    )
    type_url, nonce, spans, removed = scan_delta_response(data)
    assert (type_url, nonce, removed) == (CDS, "n-9", ["x", "y"])
    assert [delta_resource(data, s)[:2] for s in spans] == [
        ("outbound|80||a", "v-outbound|80||a"),
        ("outbound|80||b", "v-outbound|80||b"),
    ]
    _, _, inner = delta_resource(data, spans[0])
    assert any_pb2.Any.FromString(data[inner[0] : inner[1]]).type_url == CDS


def test_route_names_are_read_from_the_listeners_connection_managers() -> None:
    def names(listener: any_pb2.Any) -> list[str]:
        data = discovery_pb2.Resource(name="l", resource=listener).SerializeToString()
        return listener_route_names(data, delta_resource(data, (0, len(data)))[2])

    assert names(_listener("0.0.0.0_8080", "8080")) == ["8080"]
    assert names(_listener("virtualInbound", inline=True)) == []
    assert names(_listener("10.0.0.1_9000", tcp=True)) == []
    assert names(_listener("mixed", "80", "svc:90", inline=True, tcp=True)) == ["80", "svc:90"]
    default_chain = listener_pb2.Listener(
        name="d", default_filter_chain=listener_components_pb2.FilterChain(filters=[_hcm_filter(rds="443")])
    )
    assert names(_any(LDS, default_chain)) == ["443"]


def test_a_sidecar_goes_cds_eds_lds_rds_and_follows_changes() -> None:
    proxy = _proxy()
    opening = [_parse(r) for r in opening_requests(proxy, b"\x0a\x01x")]
    assert [(r.type_url, list(r.resource_names_subscribe)) for r in opening] == [(CDS, [])]

    # CDS: the outbound clusters are subscribed for EDS, after the ACK.
    cds = _response(CDS, _clusters("outbound|80||a", "outbound|80||b", "inbound|80||"), nonce="c1")
    assert apply_response(proxy, cds) == (CDS, "c1")
    (eds_request,) = [_parse(r) for r in follow_up(proxy, CDS)]
    assert list(eds_request.resource_names_subscribe) == ["outbound|80||a", "outbound|80||b"]
    assert not eds_request.response_nonce
    proxy.acked.add(CDS)
    assert not proxy.synced

    # EDS: then LDS, as a wildcard.
    apply_response(proxy, _response(EDS, [("outbound|80||a", "e1", _named(EDS, "outbound|80||a"))]))
    (lds_request,) = [_parse(r) for r in follow_up(proxy, EDS)]
    assert lds_request.type_url == LDS and not lds_request.resource_names_subscribe
    proxy.acked.add(EDS)
    assert follow_up(proxy, EDS) == []  # LDS is asked for once a stream

    # LDS: RDS for the names the listeners hold.
    apply_response(
        proxy,
        _response(
            LDS, [("0.0.0.0_8080", "l1", _listener("0.0.0.0_8080", "8080")), ("vi", "l1", _listener("vi"))]
        ),
    )
    (rds_request,) = [_parse(r) for r in follow_up(proxy, LDS)]
    assert list(rds_request.resource_names_subscribe) == ["8080"]
    proxy.acked.add(LDS)
    apply_response(proxy, _response(RDS, [("8080", "r1", _named(RDS, "8080"))]))
    assert follow_up(proxy, RDS) == []
    proxy.acked.add(RDS)
    assert proxy.synced
    assert proxy.resource_counts() == {CDS: 3, EDS: 1, LDS: 2, RDS: 1}

    # A cluster removed: its EDS unsubscribed and forgotten.
    apply_response(proxy, _response(CDS, [], nonce="c2", removed=("outbound|80||b",)))
    (unsubscribe,) = [_parse(r) for r in follow_up(proxy, CDS)]
    assert list(unsubscribe.resource_names_unsubscribe) == ["outbound|80||b"]
    assert not unsubscribe.resource_names_subscribe
    assert proxy.subscribed[EDS] == {"outbound|80||a"}
    assert proxy.removed == {CDS: 1}

    # A listener removed: the route no listener names is unsubscribed.
    apply_response(proxy, _response(LDS, [], removed=("0.0.0.0_8080",)))
    (rds_drop,) = [_parse(r) for r in follow_up(proxy, LDS)]
    assert list(rds_drop.resource_names_unsubscribe) == ["8080"]
    assert proxy.held[RDS] == {}


def test_a_new_stream_resumes_every_type_with_the_versions_held() -> None:
    proxy = _proxy()
    opening_requests(proxy, b"")
    apply_response(proxy, _response(CDS, _clusters("outbound|80||a")))
    follow_up(proxy, CDS)
    apply_response(proxy, _response(EDS, [("outbound|80||a", "e1", _named(EDS, "outbound|80||a"))]))
    follow_up(proxy, EDS)
    apply_response(proxy, _response(LDS, [("l", "l1", _listener("l", "80"))]))
    follow_up(proxy, LDS)
    apply_response(proxy, _response(RDS, [("80", "r1", _named(RDS, "80"))]))

    # The stream drops; the next one starts as run_delta_proxy starts it.
    proxy.acked.clear()
    proxy.requested.clear()
    proxy.resumed.clear()
    node = ProxySpec(NODE_ID, {}).node().SerializeToString()
    requests = [_parse(r) for r in opening_requests(proxy, node)]
    assert [r.type_url for r in requests] == [CDS, EDS, LDS, RDS]
    assert requests[0].node.id == NODE_ID and not any(r.HasField("node") for r in requests[1:])
    assert dict(requests[0].initial_resource_versions) == {"outbound|80||a": "v-outbound|80||a"}
    assert list(requests[1].resource_names_subscribe) == ["outbound|80||a"]
    assert dict(requests[1].initial_resource_versions) == {"outbound|80||a": "e1"}
    assert dict(requests[2].initial_resource_versions) == {"l": "l1"}
    assert list(requests[3].resource_names_subscribe) == ["80"]
    # Nothing new to ask for when the server answers with what changed (nothing here).
    apply_response(proxy, _response(CDS, []))
    assert follow_up(proxy, CDS) == []
    apply_response(proxy, _response(EDS, []))
    assert follow_up(proxy, EDS) == []
    # Resumed types count as synced once the stream has outlived the server's rate-limit wait.
    proxy.up, proxy.connected_at = True, time.time() - 2
    assert proxy.synced


def test_no_clusters_is_an_empty_config_and_goes_straight_to_lds() -> None:
    proxy = _proxy()
    opening_requests(proxy, b"")
    apply_response(proxy, _response(CDS, _clusters("inbound|80||")))
    (lds,) = [_parse(r) for r in follow_up(proxy, CDS)]
    assert lds.type_url == LDS
    assert proxy.empty_configs == 1


def test_the_marker_is_seen_in_a_delta_response() -> None:
    proxy = _proxy()
    proxy.marker, proxy.marker_type = b"10.128.0.42", EDS
    assignment = _named(EDS, "outbound|80||a 10.128.0.42")
    data = _response(EDS, [("outbound|80||a", "e2", assignment)])
    type_url, _ = apply_response(proxy, data)
    proxy.saw(type_url, data, 12.5)
    assert proxy.marker_seen == 12.5


# -- the runner and the report ---------------------------------------------------------


def test_jobs_run_each_delta_variant_right_after_its_sotw_run() -> None:
    from bench.fleet_run import COMPILED, PURE

    job = FleetJob(Scenario("s"), (COMPILED, PURE), delta=(COMPILED,))
    assert job.runs() == [(COMPILED, "sotw"), (COMPILED, "delta"), (PURE, "sotw")]


def _run(protocol: str, cpu: float, received: int) -> dict[str, Any]:
    spec = Scenario("http-200", services=200, proxies=400).__dict__
    change = {
        "proxies": 400,
        "converged": 400,
        "from_write_seconds": {"p50": 0.2, "p99": 0.35},
        "fan_out_seconds": {"p99": 0.2},
        "server_cpu_seconds": cpu,
        "bytes_per_proxy": received,
        "sent_bytes_per_proxy": 120 if protocol == "delta" else 9000,
    }
    return {
        "scenario": "http-200",
        "variant": "compiled",
        "protocol": protocol,
        "scenario_spec": spec,
        "sync_seconds": 4.0,
        "endpoint_added": change,
        "unchanged_rewrite": {"server_cpu_seconds": 0.01},
    }


def test_the_report_puts_both_protocols_and_the_floor_side_by_side() -> None:
    floor = FloorJob(400, 1305, 80, "endpoint added (EDS)", protocol="delta", scenario="http-200")
    fleet = [_run("sotw", 0.4, 1400), _run("delta", 0.2, 1500)]
    sized, source = floor.sized(fleet)
    assert (sized.message_bytes, sized.ack_bytes, source) == (1500, 120, "the fleet run")
    rounds = [{"acks": 400, "streams": 400, "server_cpu_seconds": s} for s in (0.1, 0.12, 0.5)]
    results = {
        "fleet": fleet,
        "grpc_floor": [
            {
                "stands_for": floor.stands_for,
                "protocol": "delta",
                "scenario": "http-200",
                "change": "endpoint_added",
                "sized_from": source,
                "streams": 400,
                "message_bytes": 1500,
                "ack_bytes": 120,
                "rounds": rounds,
            }
        ],
    }
    section = "\n".join(report_delta.protocol_section(results))
    assert "| endpoint added: server CPU, s | 0.40 | 0.20 | 0.50x |" in section
    floors = "\n".join(report_delta.push_floor_section(results))
    assert "| endpoint added (EDS) | http-200 | delta | the fleet run | 400 | 1500 | 120 | 0.20 |" in floors
    assert "1.67x" in floors  # 0.2 over the median round, 0.12
    goals = report_delta.goals(results)
    assert goals[0][0].startswith("Endpoint added: p99 after the debounce (delta")
    assert goals[-1][3].startswith("missed")
    # Delta's memory is judged on its own run, not state-of-the-world's.
    fleet[1]["peak_rss_mib"], fleet[0]["peak_rss_mib"] = 1300.0, 600.0
    peak = next(g for g in report_delta.goals(results) if g[0].startswith("Peak RSS"))
    assert "(delta, 400 sidecars" in peak[0]
    assert (peak[2], peak[3]) == ("1,300 MiB", "missed (1.27x the target)")


def test_the_least_p99_a_server_at_the_floor_could_reach_here_is_reported() -> None:
    run = _run("delta", 0.2, 1500)
    run["endpoint_added"].update(first_seconds=0.15, fleet_cpu_seconds=0.3)
    floor = {
        "protocol": "delta",
        "scenario": "http-200",
        "change": "endpoint_added",
        "rounds": [{"acks": 4, "streams": 4, "server_cpu_seconds": s} for s in (0.1, 0.2, 0.9)],
    }
    results = {"machine": {"cpus": 2}, "fleet": [run], "grpc_floor": [floor]}
    text = "\n".join(report_delta.latency_bounds(results))
    # 0.15 to the first copy, less the 0.1 s debounce, then (0.2 floor + 0.3 simulator) / 2 cores.
    assert "Endpoint added: p99 after the debounce: 0.30 s (goal 0.3 s;" in text
    assert "VirtualService" not in text  # no route change, no floor for it: nothing claimed
    assert report_delta.latency_bounds({"fleet": [], "grpc_floor": [floor]}) == []


def test_a_change_made_in_rounds_is_reported_by_its_median_round_with_every_round_beside_it() -> None:
    made = [
        {
            "proxies": 400,
            "converged": converged,
            "server_cpu_seconds": cpu,
            "from_write_seconds": {"p99": p99},
            "fan_out_seconds": {"p99": p99 / 2},
        }
        for cpu, p99, converged in ((0.9, 1.2, 400), (0.5, 0.8, 400), (0.7, 1.0, 400), (1.4, 1.9, 400))
    ]
    chosen = median_round(made)
    # The lower of the middle two of an even count: 0.7 of 0.7 and 0.9, with that round's p99.
    assert (chosen["server_cpu_seconds"], chosen["from_write_seconds"]["p99"]) == (0.7, 1.0)
    assert [r["server_cpu_seconds"] for r in chosen["rounds"]] == [0.9, 0.5, 0.7, 1.4]
    assert [r["from_write_p99"] for r in chosen["rounds"]] == [1.2, 0.8, 1.0, 1.9]
    # A round some proxy never converged in is listed, not chosen: of 0.5, 0.7 and 1.4, 0.7.
    partial = [{**made[0], "converged": 399}, *made[1:]]
    assert median_round(partial)["server_cpu_seconds"] == 0.7
    assert [r["converged"] for r in median_round(partial)["rounds"]] == [399, 400, 400, 400]
    run = _run("delta", 0.2, 1500)
    run["endpoint_added"] = {**run["endpoint_added"], **chosen}
    floor = {
        "stands_for": "endpoint added (EDS)",
        "protocol": "delta",
        "scenario": "http-200",
        "change": "endpoint_added",
        "rounds": [{"acks": 400, "streams": 400, "server_cpu_seconds": 0.35}],
    }
    section = "\n".join(report_delta.push_floor_section({"fleet": [run], "grpc_floor": [floor]}))
    assert "| 0.70 | 0.90, 0.50, 0.70, 1.40 |" in section
    assert "| 2.00x |" in section


def test_each_floor_runs_a_round_after_each_round_of_the_push_it_stands_for(monkeypatch: Any) -> None:
    """The floor meets the host as its push did: a floor measured a suite later moved a ratio by a
    quarter on its own, and one measured after its fleet run still minutes later."""
    from bench import run as bench_run
    from bench.fleet_run import COMPILED, PURE

    scenario = Scenario("http-200", services=200, proxies=400)
    job = FleetJob(scenario, (COMPILED, PURE), delta=(COMPILED,), rounds=2)
    floors = (
        FloorJob(400, 1305, 80, "endpoint added (delta)", protocol="delta", scenario="http-200"),
        FloorJob(400, 1305, 47000, "endpoint added (sotw)", protocol="sotw", scenario="http-200"),
        FloorJob(400, 1305, 80, "no fleet run of its own", protocol="delta", scenario="elsewhere"),
        FloorJob(
            400,
            500_000,
            80,
            "routes (delta)",
            protocol="delta",
            scenario="http-200",
            change="virtual_service_changed",
        ),
    )
    suite = bench_run.Suite("test", 0.1, (job,), (), floors)
    order: list[str] = []

    def fleet(
        job: FleetJob, variant: Any, tmp: Any, protocol: str, after_round: Any = None
    ) -> dict[str, Any]:
        order.append(f"fleet {variant.name} {protocol}")
        made = _run(protocol, 0.3, 1500)
        for n in range(job.rounds):
            for change, received in (("endpoint_added", 1500 + n), ("virtual_service_changed", 400_000 + n)):
                order.append(f"fleet round {change}")
                after_round(change, {**made["endpoint_added"], "bytes_per_proxy": received})
        return {**made, "variant": variant.name}

    class Floor:
        def __init__(self, streams: int, size: int, ack: int) -> None:
            self.size, self.ack = size, ack
            self.described = {"streams": streams, "message_bytes": size, "ack_bytes": ack}

        def start(self) -> Floor:
            order.append(f"floor up {self.size} {self.ack}")
            return self

        def close(self) -> None:
            order.append(f"floor down {self.size}")

        def round(self) -> dict[str, Any]:
            order.append(f"floor round {self.size}")
            return {"server_cpu_seconds": 0.1}

    def alone(streams: int, size: int, ack: int, rounds: int) -> dict[str, Any]:
        order.append(f"floor alone {ack}")
        return {"rounds": [{"server_cpu_seconds": 0.1}]}

    monkeypatch.setattr(bench_run, "run_fleet", fleet)
    monkeypatch.setattr(bench_run.grpc_floor, "Floor", Floor)
    monkeypatch.setattr(bench_run.grpc_floor, "run", alone)
    monkeypatch.setattr(bench_run, "host_speed", lambda: 0.2)
    results = bench_run.run_suite(suite, {"http-200", "floor"})
    # Each floor at the bytes of its push's first round, a round after each of its push's rounds,
    # and down once it measured as many as the fleet makes; a floor whose push no fleet run made
    # runs alone, last.
    endpoint, routes = ["fleet round endpoint_added"], ["fleet round virtual_service_changed"]
    assert order == [
        "fleet compiled sotw",
        *endpoint,
        "floor up 1500 9000",
        "floor round 1500",
        *routes,
        *endpoint,
        "floor round 1500",
        "floor down 1500",
        *routes,
        "fleet compiled delta",
        *endpoint,
        "floor up 1500 120",
        "floor round 1500",
        *routes,
        "floor up 400000 120",
        "floor round 400000",
        *endpoint,
        "floor round 1500",
        "floor down 1500",
        *routes,
        "floor round 400000",
        "floor down 400000",
        f"fleet {PURE.name} sotw",
        *endpoint,
        *routes,
        *endpoint,
        *routes,
        "floor alone 80",
    ]
    assert [f["stands_for"] for f in results["grpc_floor"]] == [f.stands_for for f in floors]
    assert [f["sized_from"] for f in results["grpc_floor"]] == [
        "the fleet run's first round",
        "the fleet run's first round",
        "estimate",
        "the fleet run's first round",
    ]
    assert [len(f["rounds"]) for f in results["grpc_floor"]] == [2, 2, 1, 2]
