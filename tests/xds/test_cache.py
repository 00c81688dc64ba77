"""The XdsCache: LRU, dependency eviction, stale writes, and keys that miss no input."""

from __future__ import annotations

from typing import Any

import pytest
from support.kube import istio, service, workload
from support.mesh_objects import mesh_objects
from support.model import Model, build

from meshpilot.config.decode import decode_object
from meshpilot.model.config import ConfigKey
from meshpilot.model.kind import Kind
from meshpilot.model.push_request import PushRequest
from meshpilot.server.metrics import Metrics
from meshpilot.xds.cache import TypedCache, XdsCache, new_token
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.generators import sidecar_generators
from meshpilot.xds.generators.base import GenerationContext
from meshpilot.xds.types import TypeUrl

SE = ConfigKey(Kind.SERVICE_ENTRY, "reviews", "default")
DOMAIN = "default~default.svc.cluster.local"
DR = ConfigKey(Kind.DESTINATION_RULE, "reviews", "default")


def test_read_series_appear_with_their_first_count() -> None:
    # As istiod's: xds_cache_reads{type="hit"} is not exported at 0 before any read hit.
    metrics = Metrics()
    cache = TypedCache(2, metrics)
    reads = metrics.registry
    assert reads.get_sample_value("xds_cache_reads_total", {"type": "miss"}) is None
    assert cache.get(1) is None
    assert reads.get_sample_value("xds_cache_reads_total", {"type": "miss"}) == 1
    assert reads.get_sample_value("xds_cache_reads_total", {"type": "hit"}) is None
    assert cache.add(1, b"one", frozenset(), new_token())
    assert cache.get(1) == b"one"
    assert reads.get_sample_value("xds_cache_reads_total", {"type": "hit"}) == 1


def test_lru_and_dependency_eviction() -> None:
    metrics = Metrics()
    cache = TypedCache(2, metrics)
    token = new_token()
    assert cache.add(1, b"one", frozenset({SE}), token)
    assert cache.add(2, b"two", frozenset({DR}), token)
    assert cache.get(1) == b"one"  # 1 is now the most recently used
    assert cache.add(3, b"three", frozenset(), token)
    assert cache.get(2) is None, "the least recently used entry was evicted"
    assert cache.clear({SE}) == 1
    assert cache.get(1) is None and cache.get(3) == b"three"
    reads = metrics.registry
    assert reads.get_sample_value("xds_cache_reads_total", {"type": "hit"}) == 2
    assert reads.get_sample_value("xds_cache_reads_total", {"type": "miss"}) == 2
    assert reads.get_sample_value("xds_cache_evictions_total", {"type": "size"}) == 1
    assert reads.get_sample_value("xds_cache_evictions_total", {"type": "clear"}) == 1


def test_writes_from_before_an_eviction_are_dropped() -> None:
    cache = TypedCache(10)
    started = new_token()
    cache.clear({SE})
    assert not cache.add(1, b"stale", frozenset({SE}), started)
    assert cache.get(1) is None
    later = new_token()
    assert cache.add(1, b"fresh", frozenset({SE}), later)
    assert not cache.add(1, b"older", frozenset({SE}), later - 1), "an older write never replaces a newer one"
    assert cache.get(1) == b"fresh"


def test_replacing_an_entry_keeps_the_reverse_index_exact() -> None:
    cache = TypedCache(10)
    cache.add(1, b"a", frozenset({SE}), new_token())
    cache.add(1, b"b", frozenset({DR}), new_token())
    assert cache.clear({SE}) == 0, "the entry no longer depends on SE"
    assert cache.clear({DR}) == 1
    assert cache.dependent_config_count() == 0


def test_entries_sharing_a_dependency_set_are_evicted_each_by_its_own_cause() -> None:
    metrics = Metrics()
    cache = TypedCache(3, metrics)
    shared = frozenset({SE, DR})
    other = ConfigKey(Kind.VIRTUAL_SERVICE, "reviews", "default")
    cache.add(1, b"one", shared, new_token())
    # An equal set made apart (another scope's) is the same set to the index.
    cache.add(2, b"two", frozenset({DR, SE}), new_token())
    cache.add(3, b"three", shared, new_token())
    # Replaced with other dependencies: 1 leaves the shared set, which 2 and 3 still hold.
    cache.add(1, b"one again", frozenset({other}), new_token())
    # Size eviction takes the least recently used, 2, and only it.
    cache.add(4, b"four", shared, new_token())
    assert cache.get(2) is None
    assert cache.dependent_config_count() == 3
    assert cache.clear({SE}) == 2, "3 and 4"
    assert cache.get(3) is None and cache.get(4) is None
    assert cache.dependent_config_count() == 1, "the set is gone from DR's index too"
    assert cache.clear({DR}) == 0, "gone from every config the set named"
    assert cache.get(1) == b"one again"
    assert cache.dependent_config_count() == 1
    # The last entry of a set replaced: the set leaves the index with it.
    cache.add(1, b"one, third", frozenset({SE}), new_token())
    assert cache.dependent_config_count() == 1
    assert cache.clear({other}) == 0
    assert cache.clear({other, SE}) == 1
    assert cache.dependent_config_count() == 0
    # A config in two sets: clearing it takes both, and leaves nothing indexed under the others.
    cache.add(5, b"five", shared, new_token())
    cache.add(6, b"six", frozenset({SE}), new_token())
    assert cache.clear({SE}) == 2
    assert cache.dependent_config_count() == 0
    assert metrics.registry.get_sample_value("xds_cache_evictions_total", {"type": "size"}) == 1


Payloads = dict[str, bytes]


def _generate(
    model: Model, proxy: Any, cache: XdsCache | None, type_url: TypeUrl, names: frozenset[str]
) -> Payloads:
    generator = sidecar_generators()[type_url]
    request = PushRequest(push=model.push, token=new_token())
    watch = WatchedResource(type_url, names=names, wildcard=not names)
    ctx = GenerationContext(proxy, model.push, model.index, request, cache)
    return {r.name: r.payload for r in generator.generate(ctx, watch, None) or []}


def _alone(model: Model, proxy: Any, type_url: TypeUrl, names: frozenset[str]) -> Payloads:
    """What the proxy gets with nothing shared: a snapshot of its own, no cache."""
    own = Model(model.env, model.env.build_push_context("alone", keep_lasting=False))
    model.env.refresh_proxy(proxy, own.push)
    try:
        return _generate(own, proxy, None, type_url, names)
    finally:
        model.env.refresh_proxy(proxy, model.push)


def _proxies(model: Model) -> list[Any]:
    return [
        model.proxy("sidecar~10.1.0.11~productpage-v1.default~default.svc.cluster.local"),
        model.proxy(
            "sidecar~10.1.0.12~productpage-v2.default~default.svc.cluster.local",
            {"LABELS": {"app": "productpage", "version": "v2"}},
        ),
        model.proxy("sidecar~10.1.0.31~ratings-v1.other~other.svc.cluster.local"),
        model.proxy(
            "sidecar~10.1.0.13~mx.default~default.svc.cluster.local", extensions=["istio.metadata_exchange"]
        ),
        model.proxy("sidecar~fd00::13~v6.default~default.svc.cluster.local", {"INSTANCE_IPS": "fd00::13"}),
        model.proxy(
            "sidecar~10.1.0.14~none.default~default.svc.cluster.local", {"INTERCEPTION_MODE": "NONE"}
        ),
    ]


@pytest.mark.parametrize("selector_rule", [False, True], ids=["", "selector-dr"])
@pytest.mark.parametrize("source_matching", [False, True], ids=["plain", "source-matching-vs"])
@pytest.mark.parametrize("type_url", [TypeUrl.CLUSTER, TypeUrl.ENDPOINT, TypeUrl.LISTENER, TypeUrl.ROUTE])
def test_a_shared_cache_gives_every_proxy_exactly_what_it_would_get_uncached(
    type_url: TypeUrl, source_matching: bool, selector_rule: bool
) -> None:
    """If a cache or memo key missed an input, some proxy would be served another proxy's entry here."""
    docs = [
        *mesh_objects(),
        istio(
            "DestinationRule",
            "ratings",
            "other",
            {"host": "ratings", "trafficPolicy": {"tls": {"mode": "ISTIO_MUTUAL"}}},
        ),
    ]
    if source_matching:
        docs.append(
            istio(
                "VirtualService",
                "by-source",
                "default",
                {
                    "hosts": ["reviews"],
                    "http": [
                        {
                            "match": [{"sourceLabels": {"version": "v2"}}],
                            "route": [{"destination": {"host": "reviews", "subset": "v2"}}],
                        },
                        {"route": [{"destination": {"host": "reviews", "subset": "v1"}}]},
                    ],
                },
            )
        )
    if selector_rule:
        # Only productpage v2 takes this rule: its v2 subset means other pods than the shared rule's.
        docs.append(
            istio(
                "DestinationRule",
                "reviews-for-v2",
                "default",
                {
                    "host": "reviews",
                    "workloadSelector": {"matchLabels": {"version": "v2"}},
                    "trafficPolicy": {"tls": {"mode": "DISABLE"}},
                    "subsets": [{"name": "v2", "labels": {"version": "v1"}}],
                },
            )
        )
    model = build(docs)
    names = {
        TypeUrl.CLUSTER: frozenset(),
        TypeUrl.LISTENER: frozenset(),
        TypeUrl.ENDPOINT: frozenset(
            {
                "outbound|9080||reviews.default.svc.cluster.local",
                "outbound|9080|v2|reviews.default.svc.cluster.local",
                "outbound|9080||ratings.other.svc.cluster.local",
                "outbound|3306||db.default.svc.cluster.local",
            }
        ),
        TypeUrl.ROUTE: frozenset({"9080", "cache.default.svc.cluster.local:6000", "6000"}),
    }[type_url]
    cache = XdsCache(1000)
    for _ in range(2):  # a cold pass, then a warm one
        for proxy in _proxies(model):
            shared = _generate(model, proxy, cache, type_url, names)
            assert shared == _alone(model, proxy, type_url, names), proxy.id
    if type_url in cache.types:
        assert len(cache.types[type_url]) > 0, "the cache was used"


def test_an_endpoint_update_reaches_the_next_generation_only_through_eviction() -> None:
    model = build([*workload("reviews", "default", "10.96.0.20", 9080, {"r1": "10.1.0.21"})])
    proxy = model.proxy("sidecar~10.1.0.99~client.default~default.svc.cluster.local")
    cache = XdsCache(100)
    name = frozenset({"outbound|9080||reviews.default.svc.cluster.local"})
    before = _generate(model, proxy, cache, TypeUrl.ENDPOINT, name)
    from meshpilot.model.endpoint import Endpoint
    from meshpilot.model.endpoint_index import ShardKey

    host = "reviews.default.svc.cluster.local"
    shard = ShardKey("Kubernetes", "Kubernetes")
    model.index.update_service_endpoints(shard, host, "default", [Endpoint("10.1.0.22", 9080, "http")])
    stale = _generate(model, proxy, cache, TypeUrl.ENDPOINT, name)
    assert stale == before, "the cache still answers: this is why every endpoint update evicts"
    # What the server does on an endpoint update: change the index, evict the service's entries.
    model.index.update_service_endpoints(shard, host, "default", [Endpoint("10.1.0.23", 9080, "http")])
    cache.clear({ConfigKey(Kind.SERVICE_ENTRY, host, "default")})
    fresh = _generate(model, proxy, cache, TypeUrl.ENDPOINT, name)
    assert b"10.1.0.23" in next(iter(fresh.values()))


@pytest.mark.parametrize("type_url", [TypeUrl.CLUSTER, TypeUrl.LISTENER])
def test_outputs_kept_across_snapshots_follow_their_inputs(type_url: TypeUrl) -> None:
    """Inbound outputs outlive a snapshot; a change to what they read must still reach them."""
    from meshpilot.model.mesh import apply_mesh_config

    model = build(mesh_objects())
    proxies = _proxies(model)
    for proxy in proxies:
        _generate(model, proxy, XdsCache(1000), type_url, frozenset())
    productpage = service(
        "productpage", "default", "10.96.0.10", [("grpc", 9080), ("tcp-x", 7777)], {"app": "productpage"}
    )
    limits = istio("Sidecar", "limits", "default", {"inboundConnectionPool": {"tcp": {"maxConnections": 9}}})
    changes = [
        # The proxy's own service changes protocol and gains a port.
        lambda: model.env.registry.workloads[0].upsert(decode_object(productpage).obj),  # type: ignore[attr-defined]
        # The MeshConfig changes inbound settings.
        lambda: setattr(
            model.env,
            "mesh",
            apply_mesh_config("inboundTrafficPolicy:\n  mode: LOCALHOST\nprotocolDetectionTimeout: 3s\n"),
        ),
        # A Sidecar limits inbound connections.
        lambda: model.env.store.upsert(decode_object(limits).obj),
    ]
    for change in changes:
        change()
        model.push = model.env.build_push_context("next")
        for proxy in proxies:
            model.env.refresh_proxy(proxy, model.push)
            shared = _generate(model, proxy, XdsCache(1000), type_url, frozenset())
            assert shared == _alone(model, proxy, type_url, frozenset()), proxy.id


def test_with_the_cache_off_nothing_is_shared() -> None:
    """PILOT_XDS_CACHE_SIZE=0: every proxy's config is built for it alone, memos included."""
    model = build(mesh_objects())
    built: list[str] = []
    for share, expected in ((True, 2), (False, 6)):
        built.clear()
        model.env.share_outputs = share
        push = model.env.build_push_context(f"share-{share}", keep_lasting=False)
        for _ in range(3):
            push.memoized("snapshot", lambda: built.append("snapshot"))
            push.memoized_lasting("lasting", lambda: built.append("lasting"))
        assert len(built) == expected


def _dns_entry(localities: dict[str, str]) -> dict[str, Any]:
    """ServiceEntry ext.example.com (DNS, port 80) with an endpoint per address, in its locality."""
    endpoints = [{"address": address, "locality": where} for address, where in localities.items()]
    spec = {
        "hosts": ["ext.example.com"],
        "resolution": "DNS",
        "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
        "endpoints": endpoints,
    }
    return istio("ServiceEntry", "ext", "default", spec)


@pytest.mark.parametrize("type_url", [TypeUrl.CLUSTER, TypeUrl.ENDPOINT])
def test_locality_rewrites_are_cached_per_what_they_read(type_url: TypeUrl) -> None:
    """Proxies in other localities, or with other failoverPriority labels, never get each other's entries."""
    docs = [
        *workload("reviews", "default", "10.96.0.20", 9080, {"r-a": "10.1.0.21", "r-b": "10.1.0.22"}),
        *workload(
            "client",
            "default",
            "10.96.0.10",
            80,
            {"c-1": "10.1.0.11", "c-2": "10.1.0.12", "c-3": "10.1.0.13"},
        ),
        _dns_entry({"a.example.com": "r1/z1", "b.example.com": "r2/z1"}),
        istio(
            "DestinationRule",
            "reviews",
            "default",
            {
                "host": "reviews",
                "trafficPolicy": {
                    "outlierDetection": {"consecutive5xxErrors": 3},
                    "loadBalancer": {"localityLbSetting": {"failoverPriority": ["tier"]}},
                },
            },
        ),
        istio(
            "DestinationRule",
            "ext",
            "default",
            {"host": "ext.example.com", "trafficPolicy": {"outlierDetection": {}}},
        ),
    ]
    where = {
        "r-a": ("r1.z1", "gold"),
        "r-b": ("r2.z1", "silver"),
        "c-1": ("r1.z1", "gold"),
        "c-2": ("r1.z1", "silver"),
        "c-3": ("r2.z1", "gold"),
    }
    for doc in docs:
        if doc["kind"] == "Pod":
            locality, tier = where[doc["metadata"]["name"]]
            doc["metadata"]["labels"].update({"istio-locality": locality, "tier": tier})
    model = build(docs)
    proxies = [
        model.proxy(f"sidecar~10.1.0.{i}~c-{i - 10}.default~{DOMAIN.split('~')[1]}") for i in (11, 12, 13)
    ]
    names = (
        frozenset({"outbound|9080||reviews.default.svc.cluster.local"})
        if type_url is TypeUrl.ENDPOINT
        else frozenset()
    )
    cache = XdsCache(1000)
    outputs = []
    for _ in range(2):
        for proxy in proxies:
            shared = _generate(model, proxy, cache, type_url, names)
            assert shared == _alone(model, proxy, type_url, names), proxy.id
            outputs.append(shared)
    c1, c2, c3 = outputs[:3]
    if type_url is TypeUrl.ENDPOINT:
        # failoverPriority on tier alone: the same tier means the same priorities, wherever the proxy is.
        assert c1 == c3 != c2
    else:
        # DNS clusters' inline endpoints: failover by locality (failoverPriority does not apply there).
        assert c1 == c2 != c3


def test_dns_clusters_are_shared_across_localities_when_nothing_reads_locality() -> None:
    """Without distribute, outlier detection or PreferClose, proxies in other localities share one list."""
    docs = [
        *workload("client", "default", "10.96.0.10", 80, {"c-1": "10.1.0.11", "c-2": "10.1.0.12"}),
        _dns_entry({"a.example.com": "r1/z1"}),
    ]
    for doc in docs:
        if doc["kind"] == "Pod":
            zone = "r1.z1" if doc["metadata"]["name"] == "c-1" else "r2.z1"
            doc["metadata"]["labels"]["istio-locality"] = zone
    model = build(docs)
    proxies = [model.proxy(f"sidecar~10.1.0.{i}~c-{i - 10}.default~{DOMAIN.split('~')[1]}") for i in (11, 12)]
    assert {p.locality.label for p in proxies} == {"r1/z1", "r2/z1"}
    outputs = [_generate(model, proxy, None, TypeUrl.CLUSTER, frozenset()) for proxy in proxies]
    assert outputs[0] == outputs[1]
    assert "outbound|80||ext.example.com" in outputs[0]
    lists = [key for key in model.push._memo if isinstance(key, tuple) and key[0] == "cds-out"]
    assert len(lists) == 1, "one outbound list built for both localities"


def test_fetch_builds_on_a_miss_and_verification_catches_a_key_that_misses_an_input() -> None:
    metrics = Metrics()
    cache = TypedCache(10, metrics, type_url=TypeUrl.CLUSTER, verify=True)
    token = new_token()
    built: list[bytes] = []

    def build(value: bytes) -> bytes:
        built.append(value)
        return value

    assert cache.fetch(7, lambda: build(b"v1"), lambda: frozenset({SE}), token) == b"v1"
    assert cache.fetch(7, lambda: build(b"v1"), lambda: frozenset({SE}), token) == b"v1"
    assert built == [b"v1", b"v1"], "a verifying cache builds again on a hit"
    assert cache.mismatches == 0
    # The input changed but the key did not: the hit is stale, and verification says so.
    assert cache.fetch(7, lambda: build(b"v2"), lambda: frozenset({SE}), token) == b"v2", "the fresh value"
    assert cache.mismatches == 1
    assert metrics.registry.get_sample_value("meshpilot_xds_cache_mismatches_total", {"type": "cds"}) == 1


def test_without_verification_a_hit_builds_nothing() -> None:
    cache = TypedCache(10, None)
    token = new_token()
    cache.fetch(1, lambda: b"v1", frozenset, token)
    assert cache.fetch(1, lambda: pytest.fail("built on a hit"), frozenset, token) == b"v1"


def test_the_switch_is_istiods() -> None:
    from meshpilot.xds.cache import assertions_enabled

    assert assertions_enabled({"UNSAFE_PILOT_ENABLE_RUNTIME_ASSERTIONS": "true"})
    assert not assertions_enabled({})
