"""State-of-the-world ACK/NACK rules: whether a request needs a response, as istiod decides.

This is a pure function of the request and the stream's watch state, so it
is tested on its own, without gRPC.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from meshpilot.xds.connection import Connection, WatchedResource, shared_names
from meshpilot.xds.types import is_wildcard_type


class Verdict(enum.Enum):
    #: First request for the type, or a reconnect: send everything requested.
    INITIAL = "initial"
    #: The client acknowledged the last response; send only what was added (if anything).
    ACK = "ack"
    #: error_detail set: keep the last good config, record the error, send nothing.
    NACK = "nack"
    #: A response to an old nonce: ignore.
    STALE = "stale"
    #: Empty names on a non-wildcard type: the watch is dropped.
    UNSUBSCRIBE = "unsubscribe"


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    respond: bool
    #: For non-wildcard types, the names to send; None means all watched names.
    names: frozenset[str] | None = None


def quiet_ack(conn: Connection, type_url: str, nonce: str, names_digest: int) -> bool:
    """Record an ACK that changes nothing and needs no response, if the request is one.

    The fast path for ACKs read by ``request_head`` without a parse: the nonce
    is the one sent, the names hash as those watched, and nothing is pending
    (a NACK or a first request never comes here: their head says so). Every
    other request goes to ``decide``, which reaches the same verdict for these.
    """
    watch = conn.watched.get(type_url)
    if watch is None or not nonce or nonce != watch.nonce_sent or watch.always_respond:
        return False
    if watch.names_digest is None or names_digest != watch.names_digest:
        return False
    watch.nonce_acked = nonce
    watch.version_acked = watch.version_sent
    watch.last_error = ""
    return True


def decide(
    conn: Connection,
    type_url: str,
    names: list[str],
    nonce: str,
    error: str | None,
    names_digest: int | None = None,
) -> Decision:
    """Update ``conn``'s watch for ``type_url`` from a request and say whether to respond."""
    wildcard_type = is_wildcard_type(type_url)
    watch = conn.watched.get(type_url)
    requested = frozenset(names)
    if watch is not None and requested == watch.names:
        requested = watch.names  # an ACK of the same names: keep the shared set
    else:
        requested = shared_names(requested)
    if error is not None:
        if watch is not None:
            watch.last_error = error
        return Decision(Verdict.NACK, False)
    if not wildcard_type and not requested:
        # Envoy drops its last cluster (or listener) of a type by asking for no names.
        conn.watched.pop(type_url, None)
        return Decision(Verdict.UNSUBSCRIBE, False)
    if not nonce or watch is None:
        conn.watched[type_url] = WatchedResource(
            type_url, names=requested, wildcard=wildcard_type and not requested, names_digest=names_digest
        )
        return Decision(Verdict.INITIAL, True)
    if nonce != watch.nonce_sent:
        return Decision(Verdict.STALE, False)
    previous = watch.names
    watch.nonce_acked = nonce
    watch.version_acked = watch.version_sent
    watch.last_error = ""
    watch.names = requested
    watch.names_digest = names_digest
    if wildcard_type:
        watch.wildcard = not requested
    if watch.always_respond:
        watch.always_respond = False
        return Decision(Verdict.ACK, True)
    if requested == previous:
        return Decision(Verdict.ACK, False)
    if wildcard_type:
        return Decision(Verdict.ACK, True)
    added = requested - previous
    if not added:
        return Decision(Verdict.ACK, False)
    return Decision(Verdict.ACK, True, added)
