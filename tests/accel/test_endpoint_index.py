"""The EndpointIndex twins: same answers and same contents for every sequence of updates."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshpilot.model import endpoint_index_py
from meshpilot.model.endpoint import Endpoint
from meshpilot.model.endpoint_shards import PushType, ShardKey

HOSTS = ["a.ns.svc.cluster.local", "b.ns.svc.cluster.local"]
SHARDS = [
    ShardKey("Kubernetes", "Kubernetes"),
    ShardKey("west", "Kubernetes"),
    ShardKey("Kubernetes", "External"),
]


def _compiled() -> ModuleType | None:
    try:
        return importlib.import_module("meshpilot._ext.endpoint_index")
    except ImportError:
        return None


@pytest.fixture(params=["py", "c"])
def impl(request: pytest.FixtureRequest) -> ModuleType:
    if request.param == "py":
        return endpoint_index_py
    module = _compiled()
    if module is None:
        pytest.skip("compiled extension not built")
    return module


endpoint = st.builds(
    Endpoint,
    address=st.sampled_from(["10.0.0.1", "10.0.0.2", "10.0.0.3"]),
    port=st.sampled_from([80, 8080]),
    service_port_name=st.just("http"),
    service_account=st.sampled_from(["", "spiffe://td/ns/ns/sa/a", "spiffe://td/ns/ns/sa/b"]),
)
update = st.tuples(
    st.just("update"),
    st.sampled_from(SHARDS),
    st.sampled_from(HOSTS),
    st.sampled_from(["ns", "x"]),
    st.lists(endpoint, max_size=4),
)
delete = st.tuples(
    st.just("delete"), st.sampled_from(SHARDS), st.sampled_from(HOSTS), st.sampled_from(["ns", "x"])
)
drop_cluster = st.tuples(st.just("drop"), st.sampled_from(SHARDS))


def _apply(index: Any, op: tuple[Any, ...]) -> Any:
    if op[0] == "update":
        return index.update_service_endpoints(op[1], op[2], op[3], op[4])
    if op[0] == "delete":
        return index.delete_service_shard(op[1], op[2], op[3])
    return index.delete_shard(op[1])


def _contents(index: Any) -> list[Any]:
    return [(h, n, dict(s.shards), s.service_accounts) for h, n, s in index.services()]


@given(st.lists(st.one_of(update, delete, drop_cluster), max_size=30))
@settings(max_examples=300, deadline=None)
def test_twins_agree(ops: list[tuple[Any, ...]]) -> None:
    compiled = _compiled()
    if compiled is None:
        pytest.skip("compiled extension not built")
    py, c = endpoint_index_py.EndpointIndex(), compiled.EndpointIndex()
    for op in ops:
        assert _apply(py, op) == _apply(c, op), op
        assert _contents(py) == _contents(c)
        assert len(py) == len(c)
        assert py.generation == c.generation


def test_push_types(impl: ModuleType) -> None:
    index = impl.EndpointIndex()
    host, shard = HOSTS[0], SHARDS[0]
    a = Endpoint("10.0.0.1", 80, "http", service_account="spiffe://td/ns/ns/sa/a")
    b = Endpoint("10.0.0.2", 80, "http", service_account="spiffe://td/ns/ns/sa/a")
    assert index.update_service_endpoints(shard, host, "ns", [a]) is PushType.FULL
    assert (
        index.update_service_endpoints(
            shard, host, "ns", [Endpoint("10.0.0.1", 80, "http", service_account="spiffe://td/ns/ns/sa/a")]
        )
        is PushType.NO_PUSH
    )
    assert index.update_service_endpoints(shard, host, "ns", [a, b]) is PushType.INCREMENTAL
    c = Endpoint("10.0.0.3", 80, "http", service_account="spiffe://td/ns/ns/sa/c")
    assert index.update_service_endpoints(SHARDS[1], host, "ns", [c]) is PushType.FULL, "a new identity"
    assert index.update_service_endpoints(SHARDS[1], host, "ns", []) is PushType.FULL, "an identity gone"
    assert index.update_service_endpoints(SHARDS[1], host, "ns", []) is PushType.NO_PUSH
    shards = index.shards(host, "ns")
    assert shards.version == 4
    assert shards.service_accounts == {"spiffe://td/ns/ns/sa/a"}
