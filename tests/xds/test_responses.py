"""Responses shared by the proxies of a push: one nonce and one bytes object per content and push."""

from __future__ import annotations

import pytest
from support.kube import workload
from support.model import build

from meshpilot.model.push_context import PushContext
from meshpilot.xds import responses
from meshpilot.xds.generators.base import Resource

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"


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


def _content(payload: bytes = b"x", protocol: str = "delta", type_url: str = CDS) -> object:
    return responses.content(protocol, type_url, [Resource("a", payload)])


def test_the_same_content_of_one_push_is_one_response() -> None:
    push = _push()
    made: list[str] = []
    first = responses.response(push, 7, "v1", _content(), _builder(made))
    again = responses.response(push, 7, "v1", _content(), _builder(made))
    assert again == first and again[1] is first[1] and len(made) == 1, "built once, the same bytes object"
    nonces = {
        responses.response(push, 7, "v1", content, _builder(made))[0]
        for content in (_content(b"y"), _content(protocol="sotw"), _content(type_url=EDS))
    }
    assert len(nonces) == 3 and first[0] not in nonces, "other content, protocol or type: another nonce"
    later = responses.response(_push("v2"), 8, "v2", _content(), _builder(made))
    assert later[0] != first[0], "a new push context draws new nonces"


def test_a_stream_is_never_sent_a_nonce_twice() -> None:
    # Endpoint pushes share one context: content A, then B, then A again reaches a stream in three
    # pushes (tokens 1, 2, 3); the third must not repeat the first's nonce, or a late ACK of the
    # first would pass for an ACK of the third.
    push = _push()
    made: list[str] = []
    sent = [
        responses.response(push, token, "v1", _content(p), _builder(made))[0]
        for token, p in ((1, b"a"), (2, b"b"), (3, b"a"))
    ]
    assert len(set(sent)) == 3
    # A proxy still on an older push is sent its own response, not the newer push's nor a kept one.
    older = responses.response(push, 2, "v1", _content(b"b"), _builder(made))
    assert older[0] not in sent
    assert responses.response(push, 3, "v1", _content(b"a"), _builder(made))[0] == sent[2], (
        "push 3 still kept"
    )


def test_large_unshared_or_unpushed_responses_are_built_for_each_proxy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert responses.shareable(responses.MAX_RESOURCES)
    assert not responses.shareable(responses.MAX_RESOURCES + 1)
    made: list[str] = []
    # Not to be shared, an answer (no push token), or a server without an XdsCache (no shared outputs).
    for push, token, content in (
        (_push(), 1, None),
        (_push(), 0, _content()),
        (_push(share=False), 1, _content()),
    ):
        first = responses.response(push, token, "v1", content, _builder(made))
        assert responses.response(push, token, "v1", content, _builder(made))[0] != first[0]
    # Past the bytes kept for a push, responses are still answered, just not kept.
    monkeypatch.setattr(responses, "MAX_BYTES", 10)
    push = _push()
    first = responses.response(push, 1, "v1", _content(), _builder(made))
    assert responses.response(push, 1, "v1", _content(), _builder(made))[0] != first[0]
    assert len(made) == 8
