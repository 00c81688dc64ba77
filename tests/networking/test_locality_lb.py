"""Locality load balancing rules, checked against istiod's ApplyLocalityLoadBalancer cases."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format

from meshpilot._proto.istio.networking.v1alpha3 import destination_rule_pb2 as dr
from meshpilot.model.endpoint import Endpoint, Locality
from meshpilot.model.service import PREFER_CLOSE, Service
from meshpilot.networking import locality_lb
from meshpilot.networking.locality_lb import LocalityGroup


def setting(data: dict[str, Any]) -> Any:
    return json_format.ParseDict(data, dr.LocalityLoadBalancerSetting())


def ep(address: str, locality: str, weight: int = 1, **labels: str) -> Endpoint:
    return Endpoint(address, 80, "http", labels=dict(labels), locality=Locality(locality), weight=weight)


GROUPS = locality_lb.groups_by_locality(
    [
        ep("10.0.0.1", "region1/zone1/subzone1"),
        ep("10.0.0.2", "region1/zone1/subzone2"),
        ep("10.0.0.3", "region1/zone2/subzone1"),
        ep("10.0.0.4", "region2/zone1/subzone1"),
        ep("10.0.0.5", "region3/zone1/subzone1"),
    ]
)


def priorities(groups: list[LocalityGroup]) -> dict[str, int]:
    return {g.label: g.priority for g in groups}


def test_locality_match_and_priority() -> None:
    assert locality_lb.locality_match("region1/zone1/sub", "region1")
    assert locality_lb.locality_match("region1/zone1/sub", "region1/*")
    assert locality_lb.locality_match("region1/zone1/sub", "*")
    assert locality_lb.locality_match("region1/zone1", "region1/zone1/*")
    assert not locality_lb.locality_match("region1/zone1/sub", "region1/zone2")
    assert not locality_lb.locality_match("region2", "region1/*")
    assert locality_lb.lb_priority("r/z/s", "r/z/s") == 0
    assert locality_lb.lb_priority("r/z/s", "r/z/t") == 1
    assert locality_lb.lb_priority("r/z/s", "r/y/s") == 2
    assert locality_lb.lb_priority("r/z/s", "q/z/s") == 3


def test_groups_are_sorted_by_locality_and_weighted_by_their_endpoints() -> None:
    groups = locality_lb.groups_by_locality([ep("a", "r2", 3), ep("b", "r1"), ep("c", "r2", 2)])
    assert [(g.label, [e.address for e in g.endpoints], g.weight) for g in groups] == [
        ("r1", ["b"], 1),
        ("r2", ["a", "c"], 5),
    ]


def test_default_failover_orders_by_closeness() -> None:
    out = locality_lb.apply(GROUPS, setting({}), "region1/zone1/subzone1", {}, True)
    assert priorities(out) == {
        "region1/zone1/subzone1": 0,
        "region1/zone1/subzone2": 1,
        "region1/zone2/subzone1": 2,
        "region2/zone1/subzone1": 3,
        "region3/zone1/subzone1": 3,
    }


def test_priorities_have_no_gaps() -> None:
    out = locality_lb.apply(GROUPS, setting({}), "region1/zone9/subzone9", {}, True)
    assert priorities(out) == {
        "region1/zone1/subzone1": 0,
        "region1/zone1/subzone2": 0,
        "region1/zone2/subzone1": 0,
        "region2/zone1/subzone1": 1,
        "region3/zone1/subzone1": 1,
    }


def test_without_failover_enabled_nothing_changes() -> None:
    assert locality_lb.apply(GROUPS, setting({}), "region1/zone1/subzone1", {}, False) == GROUPS


def test_explicit_failover_region_goes_before_other_regions() -> None:
    rule = setting({"failover": [{"from": "region1", "to": "region3"}]})
    out = locality_lb.apply(GROUPS, rule, "region1/zone1/subzone1", {}, True)
    assert priorities(out) == {
        "region1/zone1/subzone1": 0,
        "region1/zone1/subzone2": 1,
        "region1/zone2/subzone1": 2,
        "region3/zone1/subzone1": 3,
        "region2/zone1/subzone1": 4,
    }
    # Another region's proxy is not affected by a failover from region1.
    out = locality_lb.apply(GROUPS, rule, "region2/zone1/subzone1", {}, True)
    assert priorities(out)["region2/zone1/subzone1"] == 0
    assert priorities(out)["region3/zone1/subzone1"] == priorities(out)["region1/zone1/subzone1"] == 1


def test_distribute_sets_weights_and_empties_unlisted_localities() -> None:
    rule = setting(
        {
            "distribute": [
                {"from": "region9/*", "to": {"region1/*": 100}},
                {"from": "region1/zone1/*", "to": {"region1/zone1/*": 80, "region2/*": 20}},
            ]
        }
    )
    out = locality_lb.apply(GROUPS, rule, "region1/zone1/subzone1", {}, False)
    summary = {g.label: (g.weight, len(g.endpoints)) for g in out}
    assert summary == {
        # A wildcard matching two localities splits its share by their weights (rounded up).
        "region1/zone1/subzone1": (40, 1),
        "region1/zone1/subzone2": (40, 1),
        "region1/zone2/subzone1": (1, 0),
        "region2/zone1/subzone1": (20, 1),
        "region3/zone1/subzone1": (1, 0),
    }
    assert all(g.priority == 0 for g in out), "distribute wins over failover"
    assert locality_lb.apply(GROUPS, rule, "region7/zone1", {}, True) == GROUPS, (
        "distribute excludes failover even when no from matches, as in istiod"
    )


def test_failover_priority_labels_split_localities() -> None:
    groups = locality_lb.groups_by_locality(
        [
            ep("a", "r1/z1", net="n1", tier="gold"),
            ep("b", "r1/z1", net="n1", tier="silver"),
            ep("c", "r1/z1", net="n2", tier="gold"),
            ep("d", "r2/z1", net="n1", tier="gold", weight_label="x"),
        ]
    )
    rule = setting({"failoverPriority": ["net", "tier"]})
    out = locality_lb.apply(groups, rule, "r9/z9", {"net": "n1", "tier": "gold"}, True)
    assert [(g.label, [e.address for e in g.endpoints], g.priority) for g in out] == [
        ("r1/z1", ["a"], 0),
        ("r1/z1", ["b"], 1),
        ("r1/z1", ["c"], 2),
        ("r2/z1", ["d"], 0),
    ]
    # A pinned value compares against that value instead of the proxy's label.
    pinned = setting({"failoverPriority": ["net=n2"]})
    out = locality_lb.apply(groups, pinned, "r9/z9", {"net": "n1"}, True)
    assert {e.address: g.priority for g in out for e in g.endpoints} == {"a": 1, "b": 1, "c": 0, "d": 1}


def test_failover_priority_with_failover_combines_both() -> None:
    groups = locality_lb.groups_by_locality(
        [ep("a", "r1/z1", net="n1"), ep("b", "r2/z1", net="n1"), ep("c", "r1/z1", net="n2")]
    )
    rule = setting({"failoverPriority": ["net"], "failover": [{"from": "r1", "to": "r2"}]})
    out = locality_lb.apply(groups, rule, "r1/z1", {"net": "n1"}, True)
    assert {e.address: g.priority for g in out for e in g.endpoints} == {"a": 0, "b": 1, "c": 2}


def test_failover_priority_needs_proxy_labels() -> None:
    rule = setting({"failoverPriority": ["net"]})
    assert locality_lb.apply(GROUPS, rule, "region1/zone1/subzone1", {}, True) == GROUPS


def test_effective_setting_rule_over_service_over_mesh() -> None:
    mesh = setting({"enabled": True, "failover": [{"from": "a", "to": "b"}]})
    assert locality_lb.effective_setting(mesh, None) == (mesh, False)
    lb = json_format.ParseDict({"localityLbSetting": {"distribute": []}}, dr.LoadBalancerSettings())
    assert locality_lb.effective_setting(mesh, lb) == (lb.locality_lb_setting, False)
    off = json_format.ParseDict({"localityLbSetting": {"enabled": False}}, dr.LoadBalancerSettings())
    assert locality_lb.effective_setting(mesh, off) == (None, False)
    assert locality_lb.effective_setting(setting({"enabled": False}), None) == (None, False)
    assert locality_lb.effective_setting(None, None) == (None, False)
    close = Service("h", "ns", "h", (), traffic_distribution=PREFER_CLOSE)
    preferred, forced = locality_lb.effective_setting(mesh, None, close)
    assert forced, "PreferClose fails over even without outlier detection"
    assert list(preferred.failover_priority) == [
        "topology.istio.io/network",
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
        "topology.istio.io/subzone",
    ]
    assert locality_lb.effective_setting(mesh, lb, close) == (lb.locality_lb_setting, False), "the rule wins"


def test_proxy_view_names_only_what_the_result_reads() -> None:
    distribute = setting({"distribute": [{"from": "r1/*", "to": {"r1/*": 100}}]})
    assert locality_lb.proxy_view(distribute, True, "r1/z1", {}) == locality_lb.proxy_view(
        distribute, True, "r1/z2", {"app": "x"}
    ), "both match the same from"
    assert locality_lb.proxy_view(distribute, True, "r2/z1", {}) is None
    assert locality_lb.proxy_view(setting({}), False, "r1/z1", {}) is None, (
        "no failover without outlier detection"
    )
    assert locality_lb.proxy_view(setting({}), True, "r1/z1", {"app": "x"}) == ("failover", "r1/z1")
    labels = setting({"failoverPriority": ["net", "zone=z1"]})
    assert locality_lb.proxy_view(labels, True, "r1/z1", {"net": "n1", "app": "x"}) == locality_lb.proxy_view(
        labels, True, "r2/z2", {"net": "n1", "app": "y"}
    ), "only the failoverPriority labels count, pinned ones not at all"
    assert locality_lb.proxy_view(labels, True, "r1", {"net": "n1"}) != locality_lb.proxy_view(
        labels, True, "r1", {"net": "n2"}
    )
