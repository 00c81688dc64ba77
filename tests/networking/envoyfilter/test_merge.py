"""istiod's MERGE: protobuf merge, except that a Duration is replaced whole; typed configs merge by type."""

from __future__ import annotations

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.extensions.filters.http.fault.v3 import fault_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from support.envoy_filters import as_dict, message

from meshpilot.networking.envoyfilter.merge import MergeError, merge, merge_any
from meshpilot.networking.protobuf import pack


def test_scalars_replace_messages_merge_lists_append() -> None:
    dst = message(
        cluster_pb2.Cluster,
        {"name": "a", "type": "EDS", "circuit_breakers": {"thresholds": [{"max_connections": 1}]}},
    )
    src = message(
        cluster_pb2.Cluster,
        {"name": "b", "circuit_breakers": {"thresholds": [{"max_requests": 2}]}},
    )
    merge(dst, src)
    assert as_dict(dst) == {
        "name": "b",
        "type": "EDS",
        "circuit_breakers": {"thresholds": [{"max_connections": 1}, {"max_requests": 2}]},
    }


def test_a_duration_is_replaced_not_merged_field_by_field() -> None:
    dst = message(cluster_pb2.Cluster, {"connect_timeout": "10.500s"})
    merge(dst, message(cluster_pb2.Cluster, {"connect_timeout": "2s"}))
    # protobuf's own merge would keep the 0.5 s of nanoseconds the value does not set.
    assert as_dict(dst)["connect_timeout"] == "2s"


def test_merge_and_replace_list_replaces_the_lists_the_value_sets() -> None:
    dst = message(
        cluster_pb2.Cluster,
        {"name": "a", "circuit_breakers": {"thresholds": [{"max_connections": 1}, {"max_connections": 3}]}},
    )
    merge(
        dst, message(cluster_pb2.Cluster, {"circuit_breakers": {"thresholds": [{"max_requests": 2}]}}), True
    )
    assert as_dict(dst)["circuit_breakers"] == {"thresholds": [{"max_requests": 2}]}


def test_map_entries_are_replaced_whole() -> None:
    dst = message(
        cluster_pb2.Cluster,
        {"metadata": {"filter_metadata": {"istio": {"a": "1", "b": "2"}, "other": {"x": "y"}}}},
    )
    merge(dst, message(cluster_pb2.Cluster, {"metadata": {"filter_metadata": {"istio": {"c": "3"}}}}))
    assert as_dict(dst)["metadata"]["filter_metadata"] == {"istio": {"c": "3"}, "other": {"x": "y"}}


def test_an_empty_message_in_the_value_is_set() -> None:
    dst = message(cluster_pb2.Cluster, {"name": "a"})
    merge(dst, message(cluster_pb2.Cluster, {"common_http_protocol_options": {}}))
    assert dst.HasField("common_http_protocol_options")


def test_typed_configs_of_one_type_merge_field_by_field() -> None:
    dst = pack(router_pb2.Router(suppress_envoy_headers=True))
    src = pack(router_pb2.Router(respect_expected_rq_timeout=True))
    merged = router_pb2.Router()
    merge_any(dst, src).Unpack(merged)
    assert merged.suppress_envoy_headers and merged.respect_expected_rq_timeout


def test_typed_configs_of_two_types_do_not_merge() -> None:
    with pytest.raises(MergeError):
        merge_any(pack(router_pb2.Router()), pack(fault_pb2.HTTPFault()))
