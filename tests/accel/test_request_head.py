"""Reading a DiscoveryRequest's head without parsing it: both twins agree, and agree with protobuf."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import pytest
from envoy.service.discovery.v3 import discovery_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from meshpilot.xds import request_head_py

FULL = request_head_py.FLAG_FULL_PARSE


def _compiled() -> ModuleType | None:
    try:
        return importlib.import_module("meshpilot._ext.request_head")
    except ImportError:
        return None


def _both(data: bytes) -> Any:
    """The twin's result (or its ValueError), checked equal to the compiled one's."""
    try:
        expected: Any = request_head_py.scan(data)
    except ValueError:
        expected = ValueError
    compiled = _compiled()
    if compiled is not None:
        try:
            got: Any = compiled.scan(data)
        except ValueError:
            got = ValueError
        assert got == expected
    return expected


text = st.text(max_size=40)
requests = st.builds(
    discovery_pb2.DiscoveryRequest,
    version_info=text,
    resource_names=st.lists(text, max_size=30),
    type_url=text,
    response_nonce=text,
)


@given(requests, st.booleans(), st.booleans())
@settings(max_examples=400, deadline=None)
def test_head_matches_the_parsed_request(request: Any, node: bool, error: bool) -> None:
    if node:
        request.node.id = "sidecar~10.0.0.1~a.ns~ns.svc.cluster.local"
    if error:
        request.error_detail.message = "rejected"
    data = request.SerializeToString()
    type_url, nonce, version, flags, start, end, count = _both(data)
    assert (type_url, nonce, version) == (request.type_url, request.response_nonce, request.version_info)
    assert bool(flags & request_head_py.FLAG_NODE) == node
    assert bool(flags & request_head_py.FLAG_ERROR) == error
    assert bool(flags & FULL) == (node or error)
    assert count == len(request.resource_names)
    names_only = discovery_pb2.DiscoveryRequest(resource_names=request.resource_names).SerializeToString()
    assert data[start:end] == names_only


@given(requests, st.randoms(use_true_random=False))
@settings(max_examples=300, deadline=None)
def test_fields_in_any_order(request: Any, rng: Any) -> None:
    """Fields may come in any order; names split by another field force the full parse."""
    parts = [
        discovery_pb2.DiscoveryRequest(resource_names=[n]).SerializeToString() for n in request.resource_names
    ]
    parts += [
        discovery_pb2.DiscoveryRequest(type_url=request.type_url).SerializeToString(),
        discovery_pb2.DiscoveryRequest(response_nonce=request.response_nonce).SerializeToString(),
    ]
    rng.shuffle(parts)
    data = b"".join(parts)
    type_url, nonce, _, flags, start, end, count = _both(data)
    assert (type_url, nonce) == (request.type_url, request.response_nonce)
    assert count == len(request.resource_names)
    if not flags & FULL:
        names = discovery_pb2.DiscoveryRequest.FromString(data[start:end]).resource_names
        assert list(names) == list(discovery_pb2.DiscoveryRequest.FromString(data).resource_names)


@given(st.binary(max_size=200))
@settings(max_examples=1000, deadline=None)
def test_arbitrary_bytes_never_crash_and_twins_agree(data: bytes) -> None:
    _both(data)


@given(requests.filter(lambda r: r.ByteSize() > 0), st.data())
@settings(max_examples=300, deadline=None)
def test_truncated_requests(request: Any, data: Any) -> None:
    raw = request.SerializeToString()
    cut = data.draw(st.integers(0, len(raw) - 1))
    _both(raw[:cut])


@pytest.mark.parametrize(
    "data",
    [
        b"\x1a\x05ab",  # length beyond the end
        b"\x1a",  # a tag without its length
        b"\x0b",  # a group start: not used by xDS
        b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f",  # a key that overflows 64 bits
        b"\x22\x02\xff\xfe",  # type_url that is not UTF-8
    ],
)
def test_malformed_is_value_error(data: bytes) -> None:
    assert _both(data) is ValueError


def test_unknown_and_scalar_fields_force_the_full_parse() -> None:
    assert _both(b"\x40\x01")[3] & FULL  # field 8, varint
    assert _both(b"\x3a\x00")[3] & FULL  # resource_locators
