"""The benchmark suite's own code, end to end on a tiny mesh.

A full run takes half an hour; these catch a broken phase (a renamed field,
a report column reading a result that is no longer written) in seconds.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench import report, report_delta, report_fleet, run
from bench.fleet import Fleet, _names_field
from bench.fleet_run import COMPILED, FleetJob, run_fleet
from bench.measure import fleet_specs
from bench.scenario import Scenario
from bench.server import ServerProcess
from bench.sidecar import EDS, ProxySpec, SimProxy
from bench.storm import StormJob, run_storm
from meshpilot.server import allocator

pytestmark = pytest.mark.integration

TINY = Scenario(name="tiny", services=3, endpoints_per_service=2, proxies=4, virtual_services=1)


@pytest.mark.timeout(180)
def test_fleet_run_measures_both_changes_and_reports_them(tmp_path: Path) -> None:
    result = run_fleet(FleetJob(TINY, (COMPILED,), steady_seconds=0.5), COMPILED, tmp_path)

    assert result["exit_code"] == 0
    assert result["empty_configs"] == 0
    for change in ("endpoint_added", "virtual_service_changed"):
        assert result[change]["converged"] == TINY.proxies, change
        assert result[change]["from_write_seconds"]["p99"] > 0
    # The endpoint push sends EDS to every proxy, and nothing else.
    assert result["endpoint_added"]["server"]["pushes"] == {'type="eds"': TINY.proxies}
    assert result["virtual_service_changed"]["server"]["send_time_seconds"]["mean"] >= 0
    assert result["endpoint_added"]["fleet_cpu_seconds"] >= 0  # a tiny fleet may use under a tick

    results = {"suite": "smoke", "fleet": [{"scenario_spec": TINY.__dict__, **result}], "storm": []}
    rendered = "\n".join(report_fleet.fleet_section(results, []))
    assert "| tiny | 3/2/4 | compiled |" in rendered
    assert report.goals(results), "the goal rows read the fleet results"


@pytest.mark.timeout(240)
def test_delta_fleet_converges_on_what_sotw_gets_and_a_reconnect_is_sent_nothing(tmp_path: Path) -> None:
    # Two rounds of each change: each round's marker is new, so each reaches every proxy.
    job = FleetJob(TINY, (COMPILED,), delta=(COMPILED,), steady_seconds=0.5, reconnect=True, rounds=2)
    runs = {
        protocol: run_fleet(job, variant, tmp_path / protocol, protocol=protocol)
        for variant, protocol in job.runs()
    }
    sotw, delta = runs["sotw"], runs["delta"]

    assert delta["exit_code"] == 0 and delta["empty_configs"] == 0
    assert delta["protocol"] == "delta"
    # The same resources, whichever protocol carried them (RDS names read from the listeners).
    assert delta["resource_names_digest"] == sotw["resource_names_digest"]
    assert delta["resources_per_proxy"] == sotw["resources_per_proxy"]
    for change in ("endpoint_added", "virtual_service_changed"):
        assert delta[change]["converged"] == TINY.proxies, change
        assert len(delta[change]["rounds"]) == 2, change
        assert [r["converged"] for r in delta[change]["rounds"]] == [TINY.proxies] * 2, change
    assert delta["endpoint_added"]["server"]["pushes"] == {'type="eds"': TINY.proxies}
    assert delta["endpoint_added"]["resources_received_per_proxy"] == {"eds": 1.0}
    # A delta ACK is the type and the nonce; a state-of-the-world EDS ACK names every cluster.
    assert delta["endpoint_added"]["sent_bytes_per_proxy"] < sotw["endpoint_added"]["sent_bytes_per_proxy"]
    # Reconnecting with what it holds, a delta sidecar is sent no resource again.
    assert delta["reconnect"]["streams_opened"] == TINY.proxies
    assert delta["reconnect"]["resources_received_per_proxy"] == {}
    assert delta["reconnect"]["bytes_per_proxy"] < sotw["reconnect"]["bytes_per_proxy"] / 10

    results = {"fleet": [{"scenario_spec": TINY.__dict__, **r} for r in runs.values()]}
    rendered = "\n".join(report_fleet.fleet_section(results, []) + report_delta.protocol_section(results))
    assert "| tiny | 3/2/4 | compiled | delta |" in rendered
    assert "| same resource names over both | - | yes | - |" in rendered


@pytest.mark.timeout(180)
def test_gateway_fleet_converges_on_endpoint_and_virtual_service_changes(tmp_path: Path) -> None:
    gateways = Scenario(
        name="tiny-gw", services=3, endpoints_per_service=2, proxies=3, virtual_services=3, gateway=True
    )
    result = run_fleet(FleetJob(gateways, (COMPILED,), steady_seconds=0.5), COMPILED, tmp_path)

    assert result["exit_code"] == 0
    assert result["empty_configs"] == 0
    for change in ("endpoint_added", "virtual_service_changed"):
        assert result[change]["converged"] == gateways.proxies, change
    assert result["endpoint_added"]["server"]["pushes"] == {'type="eds"': gateways.proxies}
    # One VirtualService changed: the gateways' one route configuration, nothing else.
    assert result["virtual_service_changed"]["server"]["pushes"] == {'type="rds"': gateways.proxies}


@pytest.mark.timeout(240)
def test_storm_run_resyncs_every_stream_after_a_drop_and_a_restart(tmp_path: Path) -> None:
    result = run_storm(StormJob(TINY, timeout=120), tmp_path)

    for event in ("streams_dropped", "server_restarted"):
        phase = result[event]
        assert phase["empty_configs"] == 0, event
        assert phase["stream_attempts"] >= TINY.proxies, event
        assert phase["ready_failures"] == 0 or event == "server_restarted"
        assert isinstance(phase["streams_ended"], dict)
    rendered = "\n".join(report_fleet.storm_section({"storm": [{"scenario_spec": TINY.__dict__, **result}]}))
    assert "streams dropped" in rendered
    assert "server restarted" in rendered


def _established_to(port: int) -> int:
    """Client-side TCP connections to ``port`` on this host, from /proc/net (gRPC may use IPv6 sockets)."""
    count = 0
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            remote, state = fields[2], fields[3]
            if state == "01" and int(remote.rsplit(":", 1)[1], 16) == port:
                count += 1
    return count


@pytest.mark.timeout(120)
@pytest.mark.parametrize("own_connections", [False, True])
def test_fleet_connections_are_shared_or_one_per_proxy(tmp_path: Path, own_connections: bool) -> None:
    config = tmp_path / "config"
    TINY.write(config)
    server = ServerProcess(config, tmp_path)
    fleet: Fleet | None = None
    try:
        server.start()
        fleet = Fleet(
            server.target, fleet_specs(TINY), TINY.route_names(), workers=1, own_connections=own_connections
        )
        fleet.start()
        fleet.wait_synced(60)
        expected = TINY.proxies if own_connections else 1
        assert _established_to(server.grpc_port) == expected
        # The floor's EDS ACKs are sized from the scenario's cluster names: they must be the ones asked for.
        names = TINY.outbound_clusters()
        assert len(names) == TINY.services
        status = fleet.status()
        assert status["eds_names_bytes"] == TINY.proxies * len(
            _names_field(SimProxy(ProxySpec("", {}), []), EDS, names)
        )
    finally:
        if fleet is not None:
            fleet.stop()
        server.stop()


@pytest.mark.timeout(120)
def test_kube_sync_benchmark_lists_and_indexes_a_small_cluster(tmp_path: Path) -> None:
    from bench import kube_sync

    result = kube_sync.run(pods=40, services=4, workdir=tmp_path)
    assert result["pods_listed"] == 40
    assert result["services"] == 4
    assert result["endpoints_indexed"] == 40
    assert 0 < result["synced_seconds"] <= result["ready_seconds"]
    rendered = "\n".join(report.kube_section({**result, "machine": {}}))
    assert "| every informer synced |" in rendered


def test_simulated_requests_are_what_protobuf_writes() -> None:
    """The simulator encodes ACKs by hand; they must be the bytes protobuf writes for the same request."""
    from envoy.service.discovery.v3 import discovery_pb2

    from bench.fleet import _request
    from bench.sidecar import LDS

    proxy = SimProxy(ProxySpec("sidecar~10.0.0.1~a.ns~ns.svc.cluster.local", {}), ["80"])
    names = [f"outbound|80||svc-{i}.ns.svc.cluster.local" for i in range(300)]
    cases = ((EDS, names, "7", "7-abc"), (LDS, [], "", ""), (EDS, [], "1", "n"))
    for type_url, asked, version, nonce in cases:
        proxy.versions[type_url], proxy.nonces[type_url] = version, nonce
        expected = discovery_pb2.DiscoveryRequest(
            version_info=version, resource_names=asked, type_url=type_url, response_nonce=nonce
        )
        assert _request(proxy, type_url, asked, first=False) == expected.SerializeToString()
    # The names are kept while the list is the same object, and re-encoded when it is not.
    again = list(names[:2])
    proxy.versions[EDS], proxy.nonces[EDS] = "8", "8-x"
    parsed = discovery_pb2.DiscoveryRequest.FromString(_request(proxy, EDS, again, first=False))
    assert list(parsed.resource_names) == again and parsed.response_nonce == "8-x"


@pytest.mark.timeout(120)
def test_grpc_floor_pushes_to_every_stream_and_reports_it() -> None:
    from bench import grpc_floor

    floor = grpc_floor.run(streams=12, size=200, ack_size=20, rounds=2)
    assert floor["streams"] == 12
    assert [r["acks"] for r in floor["rounds"]] == [12, 12]
    assert all(r["wall_seconds"] > 0 and r["server_cpu_seconds"] >= 0 for r in floor["rounds"])
    # On the allocator a meshpilot server started here would get, read from the floor's server itself.
    assert floor["allocator"] == allocator.for_new_process().allocator
    rendered = "\n".join(report_fleet.floor_section({"grpc_floor": [{"stands_for": "an EDS push", **floor}]}))
    assert "12 streams" in rendered and "12/12" in rendered and "an EDS push" in rendered
    assert f"its server on {floor['allocator']}, with the allocator settings" in rendered
    unrecorded = {k: v for k, v in floor.items() if k != "allocator"}
    assert "allocator settings" not in "\n".join(report_fleet.floor_section({"grpc_floor": [unrecorded]}))


def test_grpc_floor_hands_out_through_slots_and_every_stream_still_gets_each_round() -> None:
    from bench import grpc_floor

    # Fewer slots than streams: a slot not given back after a write would stall the round at 3 ACKs.
    floor = grpc_floor.run(streams=12, size=200, ack_size=20, rounds=1, slots=3)
    assert floor["slots"] == 3
    assert [r["acks"] for r in floor["rounds"]] == [12]


def test_grpc_floor_hands_the_message_to_no_more_streams_than_slots_are_free() -> None:
    from bench.grpc_floor import _hand_out

    async def scenario() -> list[int]:
        queues: list[asyncio.Queue[asyncio.Semaphore | None]] = [asyncio.Queue() for _ in range(12)]
        ended = {queues[4]}
        free = asyncio.Semaphore(3)
        task = asyncio.create_task(_hand_out(queues, free, ended))
        handed = []
        for _ in range(3):
            await asyncio.sleep(0)
            handed.append(sum(not q.empty() for q in queues))
            free.release()  # a stream's write done
        for _ in range(5):  # the eleven live streams' slots given back in all
            free.release()
        for _ in range(20):
            await asyncio.sleep(0)
        handed.append(sum(not q.empty() for q in queues))
        await asyncio.wait_for(task, 5)  # done once every live stream was handed the message
        return handed

    # Three at first, one more per slot given back; the stream that ended is skipped.
    assert asyncio.run(scenario()) == [3, 4, 5, 11]


def test_grpc_floor_with_work_times_it_in_the_round_and_alone() -> None:
    from bench import grpc_floor

    for batch in (0, 5):  # before each stream's write; five streams' work before their writes
        floor = grpc_floor.run(streams=12, size=200, ack_size=20, rounds=1, work=200, pool=1000, batch=batch)
        assert (floor["work_per_write"], floor["work_pool"], floor["work_batch"]) == (200, 1000, batch)
        assert [r["acks"] for r in floor["rounds"]] == [12]
        assert floor["rounds"][0]["work_cpu_seconds"] > 0 and floor["work_alone_cpu_seconds"] > 0


def test_the_floors_work_reads_the_next_objects_of_its_pool_each_time() -> None:
    from bench.grpc_floor import _Work

    work = _Work(3, pool=5)
    # Objects are (i, str(i)): each read adds i and the length of its text.
    assert work.run() == (0 + 1) + (1 + 1) + (2 + 1)
    assert work.run() == (3 + 1) + (4 + 1) + (0 + 1)  # wrapped around
    assert _Work(0).pool == ()  # no work, no pool of a hundred megabytes


def test_the_floors_batches_do_their_work_before_the_message_is_handed_out() -> None:
    from bench.grpc_floor import _hand_out_batches, _Work

    class Counted(_Work):
        def __init__(self) -> None:
            super().__init__(1, pool=1, batch=5)
            self.calls = 0

        def timed(self) -> None:
            self.calls += 1

    async def scenario(throttled: bool) -> list[tuple[int, int]]:
        queues: list[asyncio.Queue[asyncio.Semaphore | None]] = [asyncio.Queue() for _ in range(12)]
        work = Counted()
        slots = asyncio.Semaphore(5)
        throttle = slots if throttled else None
        task = asyncio.create_task(_hand_out_batches(queues, slots, throttle, {queues[4]}, work))
        seen = []
        for _ in range(3):
            await asyncio.sleep(0)
            seen.append((work.calls, sum(not q.empty() for q in queues)))
        for _ in range(6):  # every live stream's write done, its slot given back
            slots.release()
        await asyncio.wait_for(task, 5)
        seen.append((work.calls, sum(not q.empty() for q in queues)))
        return seen

    # Five streams' work, then those five handed the message; the stream that ended gets neither.
    assert asyncio.run(scenario(False)) == [(5, 5), (10, 10), (11, 11), (11, 11)]
    # Throttled: the next batch waits until its five slots are given back.
    assert asyncio.run(scenario(True)) == [(5, 5), (5, 5), (5, 5), (11, 11)]


def test_the_floor_refuses_a_batch_larger_than_its_slots() -> None:
    from bench import grpc_floor

    with pytest.raises(ValueError, match="needs at least 5 slots"):
        grpc_floor.run(streams=2, size=10, ack_size=10, rounds=1, slots=3, work=1, batch=5)


def test_a_storm_run_merged_from_another_commit_names_it() -> None:
    phase = {"resync_seconds": 1.0, "ready_latency_seconds": {"p50": 0.001, "p99": 0.002, "max": 0.003}}
    storm = {"proxies": 5, "streams_dropped": phase, "server_restarted": phase}
    apart = {"machine": {"commit": "aaaaaaa"}, "storm": [{**storm, "commit": "bbbbbbb", "date": "today"}]}
    assert "ran at commit bbbbbbb, today, apart" in "\n".join(report_fleet.storm_section(apart))
    assert "storms' rows are from commit bbbbbbb" in "\n".join(report.storms_apart(apart))
    same = {"machine": {"commit": "aaaaaaa"}, "storm": [{**storm, "commit": "aaaaaaa", "date": "today"}]}
    assert "apart" not in "\n".join(report_fleet.storm_section(same))
    assert report.storms_apart(same) == []


def test_the_host_speed_around_a_run_is_reported_when_recorded() -> None:
    timed = {"suite": "full", "machine": {"host_speed_seconds": {"before": 1.7, "after": 1.2}}}
    assert "took 1.7 s before the run and 1.2 s after it" in report.render({"full": timed})
    assert "Host speed" not in report.render({"full": {"suite": "full", "machine": {}}})


def test_the_servers_allocator_is_recorded_and_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    # Recorded from the environment the servers are started with, not from this process's allocator.
    monkeypatch.setenv("MESHPILOT_ALLOCATOR", "system")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    assert run.machine()["server_allocator"] == "system (MESHPILOT_ALLOCATOR=system)"
    named = {"suite": "full", "machine": {"server_allocator": "jemalloc (to be preloaded)"}}
    assert "meshpilot's memory allocator: jemalloc (to be preloaded)." in report.render({"full": named})
    assert "memory allocator" not in report.render({"full": {"suite": "full", "machine": {}}})
