"""Nonces, and the response bytes that the proxies of one push share.

A response is a function of the push's version, the type, the resources (or removals) and the
nonce. The proxies of a scope are pushed the same resources, so when they are also given the same
nonce they can all be written one bytes object: one allocation and copy of the response per scope
and push instead of one per proxy. A VirtualService change writes a 517 KB route configuration to
each of 2,000 proxies in the benchmark; sharing it took about a seventh off that push's server CPU
(bench/notes.md, "One response per content").

A nonce only has to tell one stream's responses apart (Envoy echoes it to say which response it
accepts or rejects, and istiod ignores an echo of any but the last). Only pushed responses are
shared, kept for one push request (its token), with a nonce drawn for each distinct content; a
stream is pushed at most one response of a type per push request, so it is never sent a nonce
twice. Answers to a proxy's own requests, and the endpoints sent after changed clusters, are built
for that proxy.

Only small responses are shared (a few resources: a push's changes); a full list (every cluster
of a scope) is large and built for each proxy. The bytes kept are bounded, and the next push's
responses replace them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Sequence

from meshpilot.model.push_context import PushContext
from meshpilot.model.push_request import PushRequest
from meshpilot.xds.generators.base import Resource

#: Writes a response around the nonce it is given.
Builder = Callable[[str], bytes]

#: Responses with more resources (and removals) than this are built for each proxy.
MAX_RESOURCES = 8
#: Bytes kept for one push (responses and the payloads that key them); past it, built per proxy.
MAX_BYTES = 64 * 1024 * 1024


def new_nonce(version: str) -> str:
    """A response's nonce: unique per response (16 random bytes cost a fifth of a uuid4 object)."""
    return f"{version}-{os.urandom(16).hex()}"


def shareable(count: int) -> bool:
    """Whether a pushed response of ``count`` resources and removals is shared (see the module)."""
    return count <= MAX_RESOURCES


def content(
    protocol: str, type_url: str, resources: Sequence[Resource], removed: Sequence[str] = ()
) -> Hashable:
    """What a response of these resources and removals holds, to share it by. ``protocol`` ("sotw"
    or "delta"): the same resources make different messages. The payloads themselves, not a hash of
    them: two contents are the same only if equal (bytes cache their hash, and a scope's proxies share
    the payload objects)."""
    return (protocol, type_url, tuple((r.name, r.payload) for r in resources), tuple(removed))


def for_stream(
    request: PushRequest,
    protocol: str,
    type_url: str,
    resources: Sequence[Resource] | Sequence[tuple[Resource, int]],
    removed: Sequence[str],
    build: Builder,
    *,
    pushed: bool,
) -> tuple[str, bytes]:
    """(nonce, bytes) of one stream's response to ``request``: shared if pushed and small.

    ``resources`` may be delta's (resource, version) pairs: they are looked at only when the
    response is small, so a full list is not copied for every proxy."""
    push = request.push
    assert push is not None
    shared_by = None
    if pushed and shareable(len(resources) + len(removed)):
        plain = [r if isinstance(r, Resource) else r[0] for r in resources]
        shared_by = content(protocol, type_url, plain, removed)
    return response(push, request.token, push.version, shared_by, build)


class _Shared:
    """The responses of the latest push request of one push context, by content."""

    __slots__ = ("held", "responses", "token")

    def __init__(self) -> None:
        self.token = 0
        self.responses: dict[Hashable, tuple[str, bytes]] = {}
        self.held = 0


def response(
    push: PushContext, token: int, version: str, shared_by: Hashable | None, build: Builder
) -> tuple[str, bytes]:
    """(nonce, bytes) of a response; ``build(nonce)`` writes it.

    ``shared_by`` (``content``) names everything the bytes hold besides the version and the nonce;
    the same content for the same push request (``token``, 0 for none) is the same response. None:
    not to be shared.
    """
    if shared_by is None or not token:
        nonce = new_nonce(version)
        return nonce, build(nonce)
    # One store per push context (a fresh one each call when the context shares no outputs).
    shared: _Shared = push.memoized(("shared-responses",), _Shared)
    if token != shared.token:
        if token < shared.token:
            # A proxy still being sent an older push (endpoint pushes share a context).
            nonce = new_nonce(version)
            return nonce, build(nonce)
        shared.token, shared.responses, shared.held = token, {}, 0
    found = shared.responses.get(shared_by)
    if found is not None:
        return found
    nonce = new_nonce(version)
    payload = build(nonce)
    # The key holds the resources' payloads, which the response contains: at most as many bytes again.
    if shared.held + 2 * len(payload) <= MAX_BYTES:
        shared.responses[shared_by] = (nonce, payload)
        shared.held += 2 * len(payload)
    return nonce, payload
