"""Digests of generated resources: equal content, equal digest; any change, another digest."""

from __future__ import annotations

import sys

from support.kube import workload
from support.model import build

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


def _push(*, share: bool = True) -> PushContext:
    model = build(workload("a", "default", "10.96.0.1", 80, {"a-0": "10.1.0.1"}))
    push: PushContext = model.env.build_push_context("v1")
    push.share_outputs = share
    return push


def test_proxies_given_the_same_parts_share_one_joined_list() -> None:
    push = _push()
    out, inbound, other = resources(b"o1", b"o2"), resources(b"i1"), resources(b"i2")
    first = joined(push, out, inbound)
    assert list(first) == [*out, *inbound]
    assert first.digest == ResourceList.joined(out, inbound).digest
    assert joined(push, out, inbound) is first
    assert list(joined(push, out, other)) == [*out, *other]


def test_the_memo_holds_the_parts_so_their_ids_stay_theirs() -> None:
    # Were a part freed while its entry lived, another list could take its id and be found under it.
    push = _push()
    out, inbound = resources(b"o1"), resources(b"i1")
    before = sys.getrefcount(out), sys.getrefcount(inbound)
    joined(push, out, inbound)
    assert (sys.getrefcount(out), sys.getrefcount(inbound)) == (before[0] + 1, before[1] + 1)


def test_without_shared_outputs_each_call_joins_anew() -> None:
    push = _push(share=False)
    out, inbound = resources(b"o1"), resources(b"i1")
    first = joined(push, out, inbound)
    assert list(first) == [*out, *inbound]
    assert joined(push, out, inbound) is not first
