"""The push history: its bounds and readings, and what the real push path records into it."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import SimpleNamespace

from envoy.config.cluster.v3 import cluster_pb2
from support.ads_client import AdsClient
from support.kube import istio, workload, write
from support.xds_server import NODE, Server, three_services

from meshpilot.model.config import ConfigKey
from meshpilot.model.kind import Kind
from meshpilot.model.push_request import PushRequest, TriggerReason
from meshpilot.push import explain
from meshpilot.push.history import MAX_CHANGES, ProxyPush, PushHistory, TypeSent

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
LDS = "type.googleapis.com/envoy.config.listener.v3.Listener"
RDS = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
REVIEWS = "outbound|9080||reviews.default.svc.cluster.local"
RATINGS = "outbound|9080||ratings.default.svc.cluster.local"
PROXY_ID = "productpage-v1.default"  # NODE's proxy: pod.namespace, as istiod names it


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _request(token: int, *keys: ConfigKey, reason: TriggerReason = TriggerReason.CONFIG) -> PushRequest:
    request = PushRequest(full=True, configs_updated=frozenset(keys), reasons=Counter({reason: 1}))
    request.push = SimpleNamespace(version=f"v{token}")  # type: ignore[assignment]
    request.token = token
    return request


def _pushed(proxy: str, names: set[str], size: int = 100, duration: float = 0.01) -> ProxyPush:
    return ProxyPush(proxy, (TypeSent("cds", frozenset(names), size),), size, duration)


def test_records_triggers_proxies_and_bytes() -> None:
    clock = Clock()
    history = PushHistory(monotonic=clock)
    key = ConfigKey(Kind.VIRTUAL_SERVICE, "reviews", "default")
    history.note_change(key, "add")
    number = history.started(_request(7, key), merged=3)
    clock.now += 0.25
    history.proxy_pushed(7, _pushed("a", {"x", "y"}, 120))
    clock.now += 0.25
    history.proxy_pushed(7, _pushed("b", {"x"}, 80))
    history.proxy_pushed(99, _pushed("a", {"z"}))  # not a recorded push: dropped

    (record,) = history.recent()
    assert record.number == number == 1
    assert (record.version, record.merged, record.proxies, record.bytes) == ("v7", 3, 2, 200)
    assert record.duration_s == 0.5
    assert record.reasons == {"config": 1}
    assert [(c.kind, c.namespace, c.name, c.change) for c in record.changes] == [
        ("VirtualService", "default", "reviews", "add")
    ]
    assert record.trigger == "VirtualService default/reviews (add)"
    ((got, push),) = history.for_proxy("a")
    assert got.number == 1 and push.resources == (("cds", "x"), ("cds", "y"))


def test_a_push_numbered_elsewhere_keeps_its_number() -> None:
    """A push worker's records take the main process's numbers (a worker started late sees push 7
    first); its own pushes are numbered apart, after the last of those, so that the main process's
    next push keeps its number."""
    history = PushHistory()
    assert history.started(_request(1), number=7) == 7
    assert history.started(_request(2), local=True) == 7
    assert history.started(_request(3), local=True) == 7
    assert history.started(_request(4), number=8) == 8
    assert history.started(_request(5), local=True) == 8
    assert [r.label for r in history.recent()] == ["8+1", "8", "7+2", "7+1", "7"]
    assert [r.local for r in history.recent()] == [1, 0, 2, 1, 0]
    assert history.pushes_started == 8
    # One process numbers every push it starts.
    single = PushHistory()
    assert [single.started(_request(t)) for t in (1, 2)] == [1, 2]


def test_a_worker_started_from_a_snapshot_names_its_own_pushes_after_the_main_s() -> None:
    """A worker that starts after push 7 has seen no numbered push yet: ``Start`` tells it the
    number, so its own push is 7+1 (not 0+1), and the debounce log line names it the same way."""
    history = PushHistory()
    history.follow(7)
    assert history.next_label(local=True) == "7+1"
    history.started(_request(1), local=True)
    assert [r.label for r in history.recent()] == ["7+1"]
    assert history.next_label(local=True) == "7+2" and history.next_label() == "8"
    history.follow(3)  # never backwards
    assert history.next_label(local=True) == "7+2"
    # explain names it so, beside a numbered push.
    history.started(_request(2), number=8)
    history.proxy_pushed(1, _pushed("p", {"x"}))
    history.proxy_pushed(2, _pushed("p", {"x"}))
    explained = explain.pushes(history, None, "p", None)
    assert [(e["push"], e["label"]) for e in explained["pushes"]] == [(8, "8"), (7, "7+1")]


def test_a_change_noted_once_is_not_reused_by_a_later_push() -> None:
    history = PushHistory()
    key = ConfigKey(Kind.SERVICE_ENTRY, "reviews.default.svc.cluster.local", "default")
    history.note_change(key, "delete")
    history.started(_request(1, key, reason=TriggerReason.SERVICE))
    history.started(_request(2, key, reason=TriggerReason.ENDPOINT))
    latest, first = history.recent()
    assert first.changes[0].change == "delete"
    assert latest.changes[0].change == "endpoints"


def test_removed_names_are_worked_out_on_read() -> None:
    sotw = TypeSent("cds", frozenset({"a", "b"}), 10, before=frozenset({"a", "b", "c", "d"}))
    delta = TypeSent("eds", ("a",), 10, dropped=("e",))
    push = ProxyPush("p", (sotw, delta), 20, 0.0)
    assert push.removed == (("cds", "c"), ("cds", "d"), ("eds", "e"))
    assert push.resources == (("cds", "a"), ("cds", "b"), ("eds", "a"))


def test_bounds_pushes_per_proxy_and_changes() -> None:
    history = PushHistory(max_pushes=5)
    keys = [ConfigKey(Kind.DESTINATION_RULE, f"r{i}", "default") for i in range(MAX_CHANGES + 7)]
    for token in range(1, 21):
        history.started(_request(token, *keys))
        history.proxy_pushed(token, _pushed("a", {"x"}))
    recent = history.recent(limit=100)
    assert [r.number for r in recent] == [20, 19, 18, 17, 16]
    assert len(recent[0].changes) == MAX_CHANGES and recent[0].changes_dropped == 7
    assert recent[0].trigger.endswith(f"and {MAX_CHANGES + 6} more")
    assert [r.number for r, _ in history.for_proxy("a", limit=100)] == list(range(20, 10, -1))
    # A push that fell out of the history takes its token with it.
    history.proxy_pushed(1, _pushed("b", {"x"}))
    assert history.for_proxy("b") == []


def test_slowest_proxies_and_forgetting_disconnected_ones() -> None:
    clock = Clock()
    history = PushHistory(forget_after=60, monotonic=clock)
    history.started(_request(1))
    for proxy, duration in (("fast", 0.01), ("slow", 0.9), ("middle", 0.2)):
        history.connected(proxy)
        history.proxy_pushed(1, _pushed(proxy, {"x"}, duration=duration))
    assert history.slowest_proxies(2) == [("slow", 0.9), ("middle", 0.2)]
    history.disconnected("slow")
    assert history.for_proxy("slow"), "kept for a while after it left"
    clock.now += 61
    history.disconnected("fast")
    assert history.for_proxy("slow") == [] and history.proxy_ids() == ["fast", "middle"]


def test_a_push_written_after_its_stream_was_forgotten_is_forgotten_too() -> None:
    clock = Clock()
    history = PushHistory(forget_after=60, monotonic=clock)
    history.started(_request(1))
    history.proxy_pushed(1, _pushed("late", {"x"}))  # no stream known for it
    assert history.for_proxy("late")
    clock.now += 61
    history.started(_request(2))
    assert history.proxy_ids() == []


def test_global_push_names_the_mesh_config() -> None:
    history = PushHistory()
    history.started(_request(1, reason=TriggerReason.GLOBAL))
    (record,) = history.recent()
    assert record.trigger == "MeshConfig / (update)"


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


async def test_the_push_path_records_what_a_real_client_got(tmp_path: Path) -> None:
    async with three_services(tmp_path) as server:
        client = await _synced(server)
        history = server.app.server.history
        before = history.pushes_started
        write(
            server.config_dir / "rule.yaml",
            [istio("DestinationRule", "ratings", "default", {"host": "ratings", "trafficPolicy": {}})],
        )
        write(
            server.config_dir / "rule.yaml",
            [
                istio(
                    "DestinationRule",
                    "ratings",
                    "default",
                    {"host": "ratings", "trafficPolicy": {"loadBalancer": {"simple": "RANDOM"}}},
                )
            ],
        )
        response = await client.recv(10)
        assert response.type_url == CDS
        client.ack(response)
        assert await client.no_response(0.5)
        records = [r for r in history.recent() if r.number > before and r.proxies]
        assert records, history.recent()
        record = records[0]
        assert record.bytes == response.ByteSize() and record.proxies == 1
        assert any(
            (c.kind, c.namespace, c.name) == ("DestinationRule", "default", "ratings") for c in record.changes
        )
        assert record.reasons.get("config", 0) >= 1 and record.full
        (push,) = [p for r, p in history.for_proxy(PROXY_ID) if r.number == record.number]
        names = {cluster_pb2.Cluster.FromString(r.value).name for r in response.resources}
        assert {n for t, n in push.resources if t == "cds"} == names
        assert push.bytes == response.ByteSize() and push.removed == ()

        # A service that goes away: its cluster is named as removed from the proxy.
        write(
            server.config_dir / "apps.yaml",
            [
                *workload("productpage", "default", "10.96.0.10", 9080, {"productpage-v1": "127.0.0.11"}),
                *workload("reviews", "default", "10.96.0.20", 9080, {"reviews-v1": "127.0.0.21"}),
            ],
        )
        response = await client.recv(10)
        assert response.type_url == CDS
        while True:  # the rest of the push (listeners, routes), acknowledged
            client.ack(response, {EDS: [REVIEWS], RDS: ["9080"]}.get(response.type_url))
            try:
                response = await client.recv(1)
            except TimeoutError:
                break
        await client.close()
        later = [(r, p) for r, p in history.for_proxy(PROXY_ID) if r.number > record.number]
        assert ("cds", RATINGS) in {item for _, p in later for item in p.removed}, later
        assert "ratings.default.svc.cluster.local" in {c.name for r, _ in later for c in r.changes}
