"""Digests of generated resources: equal content, equal digest; any change, another digest."""

from __future__ import annotations

from meshpilot.xds.generators.base import Resource, ResourceList, digest_of


def resources(*payloads: bytes) -> ResourceList:
    return ResourceList(Resource(p.decode(), p) for p in payloads)


def test_digest_follows_content_not_objects() -> None:
    a, b = resources(b"a", b"b"), resources(b"a", b"b")
    assert a is not b and a.digest == b.digest
    assert resources(b"a", b"c").digest != a.digest
    assert resources(b"b", b"a").digest != a.digest, "order is part of the state"
    assert digest_of(list(a)) == a.digest, "a plain list gets the same digest"


def test_joined_lists_change_with_either_part() -> None:
    out, inbound = resources(b"o1", b"o2"), resources(b"i1")
    joined = ResourceList.joined(out, inbound)
    assert list(joined) == [*out, *inbound]
    assert ResourceList.joined(resources(b"o1", b"o2"), resources(b"i1")).digest == joined.digest
    assert ResourceList.joined(out, resources(b"i2")).digest != joined.digest
    assert ResourceList.joined(resources(b"o1"), inbound).digest != joined.digest
