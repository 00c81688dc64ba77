"""Per-stream state: the proxy, what it watches, and what was sent and acknowledged (both protocols)."""

from __future__ import annotations

import itertools
import time
import weakref
from dataclasses import dataclass, field

from meshpilot.model.proxy import Proxy
from meshpilot.model.push_context import PushContext

_ids = itertools.count(1)
_name_sets: weakref.WeakValueDictionary[frozenset[str], frozenset[str]] = weakref.WeakValueDictionary()


def shared_names(names: frozenset[str]) -> frozenset[str]:
    """One object per distinct set of watched names.

    Proxies of one scope watch the same names; sharing the object lets
    generators memoize per-set results by identity (a memo lookup then
    never compares a thousand names).
    """
    found = _name_sets.get(names)
    if found is None:
        _name_sets[names] = found = names
    return found


@dataclass(slots=True)
class WatchedResource:
    """One subscription of a stream: a type URL and the names asked for."""

    type_url: str
    #: Requested names; empty for a wildcard subscription.
    names: frozenset[str] = frozenset()
    #: hash() of the serialized names of the request that set ``names``; an ACK
    #: whose names hash the same is recorded without parsing it. None: unknown.
    names_digest: int | None = None
    wildcard: bool = False
    nonce_sent: str = ""
    nonce_acked: str = ""
    version_sent: str = ""
    version_acked: str = ""
    last_sent: float = 0.0
    #: The error_detail of the last NACK, cleared by the next ACK.
    last_error: str = ""
    #: Names sent in the last response (SotW resources present on the proxy).
    sent_names: frozenset[str] = frozenset()
    #: Respond to the next ACK even if the names did not change (EDS after CDS: cluster warming).
    always_respond: bool = False
    #: Digest of the last response that carried the whole watched state; None after a
    #: partial one. A push whose full state has the same digest is not sent again.
    digest_sent: int | None = None
    #: ``SidecarScope.serial`` of the scope the proxy's whole state of this type was last built for
    #: (sent, found unchanged, or left unbuilt as unchanged: ``Stream._record_held``, ``_keep``); None
    #: after a partial response. A push may leave the type unbuilt only if this is the previous
    #: scope: not after a build that failed, nor after a push that did not build it.
    built_for: int | None = None
    #: Delta only: the resources the proxy holds, by name, with the version of each
    #: (``delta_protocol.resource_version``): what was sent, or what the proxy said it
    #: kept when it reconnected. A push sends only names whose version differs.
    versions: dict[str, int] = field(default_factory=dict)
    #: What the type's generator kept of its last generation for this stream, for the next one
    #: (LDS: the parts of the listeners' keys that are the proxy's own, ``generators.lds_keys``).
    kept: object = None


@dataclass(slots=True)
class Connection:
    """One ADS stream."""

    proxy: Proxy
    peer: str
    #: The SPIFFE identity that authorized the stream (the secure port); "" when anonymous.
    identity: str = ""
    #: "sotw" (StreamAggregatedResources) or "delta" (DeltaAggregatedResources).
    protocol: str = "sotw"
    id: str = ""
    connected_at: float = field(default_factory=time.time)
    watched: dict[str, WatchedResource] = field(default_factory=dict)
    #: The snapshot the stream serves from (istiod's ``LastPushContext``): the one it connected
    #: under, then each push's as the stream takes it. Requests are answered from it, not from the
    #: server's newest: a request handled before a push queued for the stream would otherwise be
    #: answered from a newer snapshot than the push then sends, and the proxy's config go back.
    push: PushContext | None = None
    #: The generation token that goes with ``push`` (istiod's ``LastPushTime``): when the stream
    #: connected, then each push's. An answer from an older snapshot made after a newer one's cache
    #: evictions is then not cached (``TypedCache.add``), as a fresh token would let it be.
    push_token: int = 0

    def __post_init__(self) -> None:
        if not self.id:
            self.id = f"{self.proxy.id}-{next(_ids)}"

    def watch(self, type_url: str) -> WatchedResource | None:
        return self.watched.get(type_url)
