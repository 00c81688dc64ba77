"""Microbenchmarks of the hot paths, compiled and pure-Python twins side by side in one run."""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from meshpilot.model import confighash_py, endpoint_index_py
from meshpilot.model.endpoint import Endpoint, Locality
from meshpilot.model.endpoint_shards import ShardKey
from meshpilot.networking import endpoint as endpoint_builder
from meshpilot.networking import wire_py


def _compiled(name: str) -> Any | None:
    try:
        return importlib.import_module(f"meshpilot._ext.{name}")
    except ImportError:
        return None


#: Shortest timed batch, in seconds (``BENCH_MIN_TIME``; the quick suite lowers it).
MIN_TIME = float(os.environ.get("BENCH_MIN_TIME", "0.2"))


def per_call(fn: Callable[[], object], *, min_time: float = 0.0, repeats: int = 5) -> float:
    """Seconds per call: the best of ``repeats`` timed batches of at least ``min_time`` each."""
    min_time = max(min_time, MIN_TIME)
    n = 1
    while True:
        started = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - started >= min_time / 4:
            break
        n *= 2
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - started) / n)
    return best


def _endpoints(count: int) -> list[Endpoint]:
    return [
        Endpoint(
            f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}",
            8080,
            "http",
            labels={"app": "reviews", "version": "v1", "security.istio.io/tlsMode": "istio"},
            service_account="spiffe://cluster.local/ns/default/sa/reviews",
            tls_mode="istio",
            locality=Locality(f"us-east/zone-{i % 3}/", "Kubernetes"),
            workload_name="reviews-v1",
            namespace="default",
        )
        for i in range(count)
    ]


CLA_NAME = "outbound|8080||reviews.default.svc.cluster.local"


def _protobuf_cla(eps: list[Endpoint]) -> bytes:
    """The reference: the same assignment built as protobuf objects, then serialized."""
    groups = endpoint_builder.locality_groups(wire_py.select(eps, "http", None), tls_mode=None)
    data: bytes = endpoint_builder.load_assignment(CLA_NAME, groups).SerializeToString()
    return data


def eds_encoding() -> list[dict[str, Any]]:
    """EDS: one ClusterLoadAssignment from endpoints, per endpoint, three ways."""
    compiled = _compiled("wire")
    out = []
    for count in (1, 100, 1000):
        eps = _endpoints(count)
        row: dict[str, Any] = {"endpoints": count}
        row["protobuf_us"] = per_call(partial(_protobuf_cla, eps)) / count * 1e6
        row["twin_us"] = (
            per_call(partial(wire_py.cluster_load_assignment, CLA_NAME, eps, "http", None, -1)) / count * 1e6
        )
        if compiled is not None:
            encode = partial(compiled.cluster_load_assignment, CLA_NAME, eps, "http", None, -1)
            row["compiled_us"] = per_call(encode) / count * 1e6
            row["compiled_vs_twin"] = row["twin_us"] / row["compiled_us"]
            row["compiled_vs_protobuf"] = row["protobuf_us"] / row["compiled_us"]
        out.append(row)
    return out


def response_assembly() -> dict[str, Any]:
    """Sending a cached ClusterLoadAssignment: cache lookup and DiscoveryResponse bytes."""
    from meshpilot.xds.cache import TypedCache, new_token

    compiled = _compiled("wire")
    payload = wire_py.any_bytes(
        "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
        wire_py.cluster_load_assignment("c", _endpoints(10), "http", None, -1),
    )
    cache = TypedCache(1000)
    cache.add(42, payload, frozenset(), new_token())

    def send(discovery_response: Callable[..., bytes]) -> bytes:
        cached = cache.get(42)
        assert cached is not None
        return discovery_response(
            "2026-11-22T00:00:00Z/1", "type.googleapis.com/x", "nonce-1234567890", [cached]
        )

    row: dict[str, Any] = {"twin_us": per_call(partial(send, wire_py.discovery_response)) * 1e6}
    if compiled is not None:
        row["compiled_us"] = per_call(partial(send, compiled.discovery_response)) * 1e6
    return row


def config_hash() -> dict[str, Any]:
    from meshpilot._proto.istio.networking.v1alpha3 import virtual_service_pb2

    compiled = _compiled("confighash")
    value = {
        "hosts": ["reviews"],
        "routes": [{"match": {"prefix": f"/p{i}"}, "weight": i} for i in range(20)],
    }
    spec = virtual_service_pb2.VirtualService(hosts=["reviews"] * 10)
    raw = spec.SerializeToString() * 20
    row: dict[str, Any] = {
        "value_twin_us": per_call(lambda: confighash_py.hash_value(value)) * 1e6,
        "bytes_twin_us": per_call(lambda: confighash_py.hash_bytes(raw)) * 1e6,
        "bytes_len": len(raw),
    }
    if compiled is not None:
        row["value_compiled_us"] = per_call(lambda: compiled.hash_value(value)) * 1e6
        row["bytes_compiled_us"] = per_call(lambda: compiled.hash_bytes(raw)) * 1e6
    return row


def endpoint_index_update() -> dict[str, Any]:
    """Replacing a 100-endpoint shard in which one endpoint changed."""
    compiled = _compiled("endpoint_index")
    shard = ShardKey("Kubernetes", "Kubernetes")
    base = _endpoints(100)
    changed = [*base[:-1], _endpoints(101)[-1]]

    def run(module: Any) -> float:
        index = module.EndpointIndex()
        index.update_service_endpoints(shard, "r.default.svc.cluster.local", "default", base)
        state = [base, changed]

        def flip() -> None:
            state.reverse()
            index.update_service_endpoints(shard, "r.default.svc.cluster.local", "default", state[0])

        return per_call(flip) * 1e6

    row: dict[str, Any] = {"twin_us": run(endpoint_index_py)}
    if compiled is not None:
        row["compiled_us"] = run(compiled)
    return row


#: Distinct traffic policies among the micro benchmark's rules (a few, as meshes stamp the same ones).
RULE_POLICIES = 10


def _cds_figures(
    services: int, destination_rules: int, rule_policies: int = RULE_POLICIES
) -> dict[str, float]:
    """Uncached CDS, protobuf CDS and the CDS cache key, µs per outbound cluster, and the cluster count."""
    from bench.model_fixture import build_model
    from meshpilot.networking.cluster import ClusterInputs, build_outbound_cluster, outbound_specs
    from meshpilot.networking.cluster_wire import OutboundClusterEncoder

    model, proxy = build_model(
        services=services, endpoints=10, destination_rules=destination_rules, rule_policies=rule_policies
    )
    inputs = ClusterInputs(proxy, model.push, model.index)
    specs = outbound_specs(proxy)

    def cds_protobuf() -> None:
        for s in specs:
            cluster = build_outbound_cluster(inputs, s.service, s.port, s.subset, s.rule)
            assert cluster is not None
            cluster.SerializeToString()

    rules = list({id(s.rule): s.rule for s in specs if s.rule is not None}.values())

    def cds() -> None:
        # A fresh snapshot memo each time, so templates are rebuilt as after a config change (a
        # snapshot's rules are its own, so what was derived from them goes too).
        model.push._memo.clear()
        for rule in rules:
            rule.derived.clear()
        encoder = OutboundClusterEncoder(inputs)
        for s in specs:
            assert encoder.encode(s)

    def cds_keys() -> None:
        for s in specs:
            s.cache_key(inputs)

    return {
        "uncached": per_call(cds, min_time=0.5, repeats=3) / len(specs) * 1e6,
        "protobuf": per_call(cds_protobuf, min_time=0.5, repeats=3) / len(specs) * 1e6,
        "key": per_call(cds_keys) / len(specs) * 1e6,
        "clusters": len(specs),
    }


def generators() -> dict[str, Any]:
    """Uncached CDS per cluster, RDS per virtual host, and the cached CDS path, from a 200-service model.

    The ``cds_dr_*`` figures are CDS again with a DestinationRule per service (two subsets and a
    traffic policy, ``Scenario.destination_rule``), the rules having ``RULE_POLICIES`` distinct
    policies among them: clusters of equal policies share a template. ``cds_dr_distinct_*``: every rule has a
    policy of its own, so each service's three clusters build their own templates, the encoder's
    worst case. Without rules every cluster of the model reuses one template, its best case.
    """
    from bench.model_fixture import build_model
    from meshpilot.networking.route import build_route_configuration, encode_route_configuration

    plain, with_rules = _cds_figures(200, 0), _cds_figures(200, 200, RULE_POLICIES)
    distinct = _cds_figures(200, 200, rule_policies=200)
    model, proxy = build_model(services=200, endpoints=10)
    route = build_route_configuration(proxy, model.push, "8080")
    vhosts = len(route.virtual_hosts)

    def rds() -> None:
        model.push._memo.clear()
        encode_route_configuration(proxy, model.push, "8080")

    return {
        "cds_uncached_us_per_cluster": plain["uncached"],
        "cds_protobuf_us_per_cluster": plain["protobuf"],
        "cds_key_us_per_cluster": plain["key"],
        "cds_dr_uncached_us_per_cluster": with_rules["uncached"],
        "cds_dr_protobuf_us_per_cluster": with_rules["protobuf"],
        "cds_dr_key_us_per_cluster": with_rules["key"],
        "rule_policies": RULE_POLICIES,
        "cds_dr_distinct_uncached_us_per_cluster": distinct["uncached"],
        "cds_dr_distinct_protobuf_us_per_cluster": distinct["protobuf"],
        "rds_uncached_us_per_vhost": per_call(rds, min_time=0.5, repeats=3) / vhosts * 1e6,
        "rds_protobuf_us_per_vhost": per_call(
            lambda: build_route_configuration(proxy, model.push, "8080").SerializeToString(),
            min_time=0.5,
            repeats=3,
        )
        / vhosts
        * 1e6,
        "clusters": int(plain["clusters"]),
        "dr_clusters": int(with_rules["clusters"]),
        "vhosts": vhosts,
    }


def _implementations() -> dict[str, str]:
    from meshpilot._ext import SELECTORS

    return {name: importlib.import_module(name).IMPLEMENTATION for name in SELECTORS}


def run_all() -> dict[str, Any]:
    return {
        "eds_encoding": eds_encoding(),
        "cached_cla_send": response_assembly(),
        "config_hash": config_hash(),
        "endpoint_index_update": endpoint_index_update(),
        "generators": generators(),
    }


if __name__ == "__main__":
    json.dump({"implementation": _implementations(), **run_all()}, sys.stdout, indent=2)
