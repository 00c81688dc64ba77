"""Digests of generated resources: equal content, equal digest; any change, another digest."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, cast

from meshpilot.model.push_context import PushContext
from meshpilot.xds.generators.base import Resource, ResourceList, digest_of, joined


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


class _Snapshot:
    """A push context's memo, as ``joined`` uses it."""

    def __init__(self) -> None:
        self.memo: dict[Hashable, Any] = {}

    def memoized(self, key: Hashable, make: Callable[[], Any]) -> Any:
        if key not in self.memo:
            self.memo[key] = make()
        return self.memo[key]


def test_proxies_given_the_same_parts_share_one_joined_list() -> None:
    push = _Snapshot()
    out, inbound, other = resources(b"o1", b"o2"), resources(b"i1"), resources(b"i2")
    first = joined(cast(PushContext, push), out, inbound)
    assert list(first) == [*out, *inbound]
    assert joined(cast(PushContext, push), out, inbound) is first
    assert list(joined(cast(PushContext, push), out, other)) == [*out, *other]


def test_a_memo_entry_left_by_other_lists_under_the_same_ids_is_not_taken() -> None:
    # Lists are keyed by id; a list freed with the memo still holding its entry may leave its id to another.
    push = _Snapshot()
    out, inbound = resources(b"o1"), resources(b"i1")
    stale = (resources(b"x"), resources(b"y"), resources(b"x", b"y"))
    push.memo[("joined", id(out), id(inbound))] = stale
    made = joined(cast(PushContext, push), out, inbound)
    assert list(made) == [*out, *inbound]
    assert made.digest == ResourceList.joined(out, inbound).digest
