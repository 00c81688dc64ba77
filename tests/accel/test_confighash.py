"""The config hash: compiled module and pure-Python twin, equal to XXH64 and to each other."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from meshpilot._proto.istio.networking.v1alpha3 import virtual_service_pb2
from meshpilot.model import confighash_py


def _compiled() -> ModuleType | None:
    try:
        return importlib.import_module("meshpilot._ext.confighash")
    except ImportError:
        return None


@pytest.fixture(params=["py", "c"])
def impl(request: pytest.FixtureRequest) -> ModuleType:
    if request.param == "py":
        return confighash_py
    module = _compiled()
    if module is None:
        pytest.skip("compiled extension not built (MESHPILOT_NO_EXTENSIONS build)")
    return module


@pytest.mark.parametrize("size", [0, 1, 3, 4, 7, 8, 31, 32, 33, 63, 64, 100, 1000])
@pytest.mark.parametrize("seed", [0, 1, 2**63 + 5])
def test_hash_bytes_is_xxh64(impl: ModuleType, size: int, seed: int) -> None:
    data = bytes((i * 31 + 7) % 256 for i in range(size))
    assert impl.hash_bytes(data, seed) == xxhash.xxh64_intdigest(data, seed=seed)


@given(st.binary(max_size=300), st.integers(min_value=0, max_value=2**64 - 1))
@settings(max_examples=200, deadline=None)
def test_hash_bytes_twins_agree_with_xxh64(data: bytes, seed: int) -> None:
    expected = xxhash.xxh64_intdigest(data, seed=seed)
    assert confighash_py.hash_bytes(data, seed) == expected
    compiled = _compiled()
    if compiled is not None:
        assert compiled.hash_bytes(data, seed) == expected


_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        | st.frozensets(st.integers() | st.text(max_size=5), max_size=4)
    ),
    max_leaves=20,
)


@given(_values)
@settings(max_examples=300, deadline=None)
def test_value_encodings_agree(value: Any) -> None:
    compiled = _compiled()
    if compiled is None:
        pytest.skip("compiled extension not built")
    assert compiled.encode_value(value) == confighash_py.encode_value(value)
    assert compiled.hash_value(value) == confighash_py.hash_value(value)


def test_dicts_and_sets_hash_the_same_in_any_order(impl: ModuleType) -> None:
    a = {"x": 1, "y": [1, 2], "z": {"k": "v", "j": None}}
    b = {"z": {"j": None, "k": "v"}, "y": [1, 2], "x": 1}
    assert impl.hash_value(a) == impl.hash_value(b)
    assert impl.hash_value(frozenset({3, 1, 2})) == impl.hash_value({2, 3, 1})


def test_different_values_hash_differently(impl: ModuleType) -> None:
    values = [
        None,
        True,
        False,
        0,
        1,
        -1,
        1.0,
        "",
        "1",
        b"1",
        [],
        [1],
        (1,),
        {},
        {"a": 1},
        {"a": 2},
        [1, 2],
        [2, 1],
        2**70,
        frozenset(),
    ]
    hashes = [impl.hash_value(v) for v in values]
    # Lists and tuples share an encoding on purpose; nothing else collides.
    assert len(set(hashes)) == len(values) - 1
    assert impl.hash_value([1]) == impl.hash_value((1,))


def test_protobuf_messages_hash_by_content(impl: ModuleType) -> None:
    first = virtual_service_pb2.VirtualService(hosts=["a", "b"])
    same = virtual_service_pb2.VirtualService(hosts=["a", "b"])
    other = virtual_service_pb2.VirtualService(hosts=["b", "a"])
    assert impl.hash_value(first) == impl.hash_value(same)
    assert impl.hash_value(first) != impl.hash_value(other)


def test_unhashable_types_are_rejected(impl: ModuleType) -> None:
    with pytest.raises(TypeError, match="cannot hash a value of type object"):
        impl.hash_value(object())


def test_values_are_stable_across_runs(impl: ModuleType) -> None:
    # Pinned: changing the encoding changes every stored hash, so it must be deliberate.
    assert impl.hash_value("reviews") == 0x38D5B5678B97A49B
    assert impl.hash_value({"host": "reviews", "port": 9080}) == 0xBAFF721249843DC2
