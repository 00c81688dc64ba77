"""Responses shared by the proxies of a push: one nonce and one bytes object per content."""

from __future__ import annotations

import pytest
from support.kube import workload
from support.model import build

from meshpilot.model.push_context import PushContext
from meshpilot.xds import responses
from meshpilot.xds.generators.base import Resource

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"


def _push(version: str = "v1", *, share: bool = True) -> PushContext:
    model = build(workload("a", "default", "10.96.0.1", 80, {"a-0": "10.1.0.1"}))
    push: PushContext = model.env.build_push_context(version)
    push.share_outputs = share
    return push


def _builder(made: list[str]) -> responses.Builder:
    def build(nonce: str) -> bytes:
        made.append(nonce)
        return f"response {nonce}".encode()

    return build


def test_the_same_content_is_one_response_per_push_context() -> None:
    push = _push()
    made: list[str] = []
    content = responses.content("delta", CDS, [Resource("a", b"x")])
    first = responses.response(push, "v1", content, _builder(made))
    again = responses.response(
        push, "v1", responses.content("delta", CDS, [Resource("a", b"x")]), _builder(made)
    )
    assert again == first and again[1] is first[1] and len(made) == 1, "built once, the same bytes object"
    other = responses.response(
        push, "v1", responses.content("delta", CDS, [Resource("a", b"y")]), _builder(made)
    )
    assert other[0] != first[0], "other content, another nonce"
    sotw = responses.response(
        push, "v1", responses.content("sotw", CDS, [Resource("a", b"x")]), _builder(made)
    )
    assert sotw[0] != first[0], "the same resources make another message over the other protocol"
    later = responses.response(_push("v2"), "v2", content, _builder(made))
    assert later[0] != first[0], "a new push context draws new nonces"


def test_large_or_unshared_responses_are_built_for_each_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    many = [Resource(str(i), b"x") for i in range(responses.MAX_RESOURCES + 1)]
    assert responses.content("delta", CDS, many) is None
    removals = [str(i) for i in range(responses.MAX_RESOURCES)]
    assert responses.content("delta", CDS, many[:1], removals) is None
    one = responses.content("delta", CDS, many[:1])
    made: list[str] = []
    for push, content in ((_push(), None), (_push(share=False), one)):
        # Not to be shared, or a server without an XdsCache (it shares no outputs).
        first = responses.response(push, "v1", content, _builder(made))
        assert responses.response(push, "v1", content, _builder(made))[0] != first[0]
    # Past the bytes kept per push context, responses are still answered, just not kept.
    monkeypatch.setattr(responses, "MAX_BYTES", 10)
    push = _push()
    first = responses.response(push, "v1", one, _builder(made))
    assert responses.response(push, "v1", one, _builder(made))[0] != first[0]
    assert len(made) == 6
