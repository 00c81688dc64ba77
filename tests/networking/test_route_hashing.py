"""Route hash policies from DestinationRule consistentHash, as istiod derives them."""

from __future__ import annotations

from typing import Any

import pytest
from support.kube import istio
from support.mesh_objects import CLIENT, mesh_objects
from support.model import build

from meshpilot.networking.route import build_route_configuration, encode_route_configuration

REVIEWS = "reviews.default.svc.cluster.local:9080"
SAME_SITE = [{"name": "SameSite", "value": "Lax"}]


def _rule(traffic_policy: dict[str, Any], subsets: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return istio(
        "DestinationRule",
        "reviews",
        "default",
        {
            "host": "reviews",
            "trafficPolicy": traffic_policy,
            "subsets": subsets
            or [{"name": "v1", "labels": {"version": "v1"}}, {"name": "v2", "labels": {"version": "v2"}}],
        },
    )


def _objects_without_reviews_rule() -> list[dict[str, Any]]:
    return [
        o
        for o in mesh_objects()
        if not (o["kind"] == "DestinationRule" and o["metadata"]["name"] == "reviews")
    ]


def _reviews_routes(*extra: dict[str, Any]) -> list[Any]:
    model = build([*_objects_without_reviews_rule(), *extra])
    config = build_route_configuration(model.proxy(CLIENT), model.push, "9080")
    # The serialized path must agree with the protobuf one.
    encoded = type(config)()
    encoded.ParseFromString(encode_route_configuration(model.proxy(CLIENT), model.push, "9080"))
    assert encoded == config
    return list({v.name: v for v in config.virtual_hosts}[REVIEWS].routes)


@pytest.mark.parametrize(
    ("hash_spec", "expected"),
    [
        ({"httpHeaderName": "x-user"}, {"header": {"headerName": "x-user"}}),
        ({"useSourceIp": True}, {"connectionProperties": {"sourceIp": True}}),
        ({"httpQueryParameterName": "user"}, {"queryParameter": {"name": "user"}}),
        (
            {
                "httpCookie": {
                    "name": "session",
                    "path": "/",
                    "ttl": "30s",
                    "attributes": [{"name": "SameSite", "value": "Lax"}],
                }
            },
            {
                "cookie": {
                    "name": "session",
                    "path": "/",
                    "ttl": "30s",
                    "attributes": [{"name": "SameSite", "value": "Lax"}],
                }
            },
        ),
    ],
)
def test_default_route_carries_the_services_hash_policy(hash_spec, expected) -> None:
    from google.protobuf import json_format

    [route] = _reviews_routes(_rule({"loadBalancer": {"consistentHash": hash_spec}}))
    assert [json_format.MessageToDict(p) for p in route.route.hash_policy] == [expected]
    # The default route keeps the default retry policy, as istiod's does.
    assert route.route.retry_policy.num_retries.value == 2


def test_no_consistent_hash_means_no_hash_policy() -> None:
    [route] = _reviews_routes(_rule({"loadBalancer": {"simple": "RANDOM"}}))
    assert not route.route.hash_policy


def test_port_level_hash_overrides_the_rule_for_the_default_route() -> None:
    policy = {
        "loadBalancer": {"consistentHash": {"httpHeaderName": "x-top"}},
        "portLevelSettings": [
            {"port": {"number": 9080}, "loadBalancer": {"consistentHash": {"httpHeaderName": "x-port"}}}
        ],
    }
    [route] = _reviews_routes(_rule(policy))
    assert [p.header.header_name for p in route.route.hash_policy] == ["x-port"]


def _vs(http: list[dict[str, Any]]) -> dict[str, Any]:
    return istio("VirtualService", "reviews", "default", {"hosts": ["reviews"], "http": http})


def test_virtual_service_destination_uses_subset_hash_before_the_rules() -> None:
    rule = _rule(
        {"loadBalancer": {"consistentHash": {"httpHeaderName": "x-top"}}},
        [
            {"name": "v1", "labels": {"version": "v1"}},
            {
                "name": "v2",
                "labels": {"version": "v2"},
                "trafficPolicy": {"loadBalancer": {"consistentHash": {"httpHeaderName": "x-subset"}}},
            },
        ],
    )
    vs = _vs(
        [
            {
                "match": [{"uri": {"prefix": "/v2"}}],
                "route": [{"destination": {"host": "reviews", "subset": "v2"}}],
            },
            {"route": [{"destination": {"host": "reviews", "subset": "v1"}}]},
        ]
    )
    to_v2, to_v1 = _reviews_routes(rule, vs)
    assert [p.header.header_name for p in to_v2.route.hash_policy] == ["x-subset"]
    assert [p.header.header_name for p in to_v1.route.hash_policy] == ["x-top"]
    # A hashed single destination must not avoid previous hosts on retry: that would break affinity.
    assert not to_v2.route.retry_policy.retry_host_predicate


def test_weighted_destinations_each_add_their_hash_policy() -> None:
    rule = _rule({"loadBalancer": {"consistentHash": {"httpHeaderName": "x-top"}}})
    vs = _vs(
        [
            {
                "route": [
                    {"destination": {"host": "reviews", "subset": "v1"}, "weight": 50},
                    {"destination": {"host": "reviews", "subset": "v2"}, "weight": 50},
                ]
            }
        ]
    )
    [route] = _reviews_routes(rule, vs)
    assert [p.header.header_name for p in route.route.hash_policy] == ["x-top", "x-top"]
    # Weighted routes keep the previous-hosts predicate (istiod passes consistentHash=false there).
    assert [p.name for p in route.route.retry_policy.retry_host_predicate] == [
        "envoy.retry_host_predicates.previous_hosts"
    ]


def test_a_rule_change_changes_the_route_cache_key_and_is_a_dependency() -> None:
    from meshpilot.model.config import ConfigKey
    from meshpilot.model.kind import Kind
    from meshpilot.networking.route import route_cache_key, route_cache_parts

    def key_and_deps(*extra: dict[str, Any]) -> tuple[int, frozenset[ConfigKey]]:
        model = build([*_objects_without_reviews_rule(), *extra])
        proxy = model.proxy(CLIENT)
        parts = route_cache_parts(proxy.sidecar_scope, "9080", "cluster.local")
        assert parts is not None
        return route_cache_key(proxy, model.push, "9080", parts), parts.dependencies

    header, deps = key_and_deps(_rule({"loadBalancer": {"consistentHash": {"httpHeaderName": "a"}}}))
    other, _ = key_and_deps(_rule({"loadBalancer": {"consistentHash": {"httpHeaderName": "b"}}}))
    assert header != other
    assert ConfigKey(Kind.DESTINATION_RULE, "reviews", "default") in deps
