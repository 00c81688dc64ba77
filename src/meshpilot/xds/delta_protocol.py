"""Delta xDS rules: subscriptions, ACK and NACK, and what a response must carry, as istiod decides.

Pure functions of a request (or of generated resources) and the stream's
watch state, tested without gRPC. Each resource the proxy holds is tracked
with a version, a hash of its serialized bytes (the same in every process); a response carries only the
resources whose version differs from what the proxy holds, and the names
it holds that no longer exist. So a reconnect that reports what it kept
(``initial_resource_versions``) is sent only what changed meanwhile.

Where this differs from istiod on purpose: a request whose nonce is stale
still changes the subscription (istiod drops the whole request, losing a
subscription Envoy will not send again); istiod resends every resource of a
full push, meshpilot only those whose bytes changed.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from meshpilot.xds.connection import Connection, WatchedResource, shared_names
from meshpilot.xds.generators.base import Resource, names_of
from meshpilot.xds.types import is_wildcard_type

#: The name that subscribes to every resource of a type.
WILDCARD = "*"
#: Longest resource name accepted. Envoy's names (clusters, routes, secrets) are a few hundred bytes;
#: anything far longer is an abuse of the stream, not a name.
MAX_NAME_BYTES = 16 * 1024
#: Most names one stream may subscribe to for one type. A sidecar watches one name per cluster; a mesh
#: whose proxies see more clusters than this is far beyond what one proxy can hold anyway.
MAX_SUBSCRIPTIONS = 65_536


class Verdict(enum.Enum):
    #: First request for the type on this stream (a new proxy or a reconnect).
    INITIAL = "initial"
    #: Acknowledges the last response (possibly changing the subscription too).
    ACK = "ack"
    #: error_detail set: keep the last good config, record the error.
    NACK = "nack"
    #: Names an older nonce (the subscription may still change).
    STALE = "stale"
    #: No nonce: only a change of subscription.
    SUBSCRIPTION = "subscription"


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    respond: bool
    #: The names to send; None means everything watched.
    names: frozenset[str] | None = None


class RefusedRequest(ValueError):
    """A request the stream must not serve (the stream ends with INVALID_ARGUMENT or RESOURCE_EXHAUSTED)."""

    def __init__(self, message: str, *, exhausted: bool = False) -> None:
        super().__init__(message)
        self.exhausted = exhausted


def version_text(version: int) -> str:
    return f"{version:016x}"


#: Versions proxies reported, by their text: a reconnect storm brings every proxy's map of what it
#: holds, the same texts thousands of times; each is kept as one int. Bounded: cleared when full.
_REPORTED: dict[str, int] = {}
_REPORTED_MAX = 1 << 20


def parse_version(text: str) -> int | None:
    """A version the proxy reports; None for one this server did not make (it will be resent)."""
    found = _REPORTED.get(text)
    if found is not None:
        return found
    if len(text) != 16:
        return None
    try:
        version = int(text, 16)
    except ValueError:
        return None
    if len(_REPORTED) >= _REPORTED_MAX:
        _REPORTED.clear()
    _REPORTED[text] = version
    return version


def check_names(names: Sequence[str]) -> None:
    """Refuse a request naming a resource longer than MAX_NAME_BYTES (both protocols)."""
    for name in names:
        if len(name) > MAX_NAME_BYTES // 4 and len(name.encode()) > MAX_NAME_BYTES:
            raise RefusedRequest(f"resource name of {len(name.encode())} bytes (at most {MAX_NAME_BYTES})")


def decide(
    conn: Connection,
    type_url: str,
    subscribe: Sequence[str],
    unsubscribe: Sequence[str],
    initial_versions: Mapping[str, str],
    nonce: str,
    error: str | None,
) -> Decision:
    """Update ``conn``'s watch for ``type_url`` from a delta request and say what to send.

    A NACK and a stale nonce acknowledge nothing, but the subscription changes they carry still
    count: Envoy sends pending subscriptions with whatever request goes next and never again.
    Raises RefusedRequest for names too long or too many; the watch is then unchanged.
    """
    for listed in (subscribe, unsubscribe, initial_versions):
        # Counted before a name is read: protobuf makes a string of a name only when it is read.
        if len(listed) > MAX_SUBSCRIPTIONS:
            raise RefusedRequest(
                f"{len(listed)} names in one request for {type_url} (at most {MAX_SUBSCRIPTIONS})",
                exhausted=True,
            )
    check_names(subscribe)
    check_names(unsubscribe)
    check_names(list(initial_versions))
    watch = conn.watched.get(type_url)
    wildcard_type = is_wildcard_type(type_url)
    if watch is None:
        if error is not None:
            return Decision(Verdict.NACK, False)  # a NACK of nothing this stream sent
        return _first(conn, type_url, wildcard_type, subscribe, unsubscribe, initial_versions)
    stale = bool(nonce) and nonce != watch.nonce_sent
    # Subscriptions first, then unsubscriptions (a name in both ends unsubscribed, as in istiod).
    added = frozenset(n for n in subscribe if n != WILDCARD and n not in watch.names) - frozenset(unsubscribe)
    dropped = frozenset(n for n in unsubscribe if n in watch.names)
    if added or dropped:
        names = (watch.names | added) - dropped
        if len(names) > MAX_SUBSCRIPTIONS:
            raise RefusedRequest(
                f"{len(names)} subscriptions for {type_url} (at most {MAX_SUBSCRIPTIONS})", exhausted=True
            )
        watch.names = shared_names(names)
        for name in dropped:
            # Envoy forgets what it unsubscribed; subscribing again must send it again.
            watch.versions.pop(name, None)
    if error is not None:
        watch.last_error = error
        verdict = Verdict.NACK
    elif stale:
        verdict = Verdict.STALE
    elif nonce:
        watch.nonce_acked = nonce
        watch.version_acked = watch.version_sent
        watch.last_error = ""
        verdict = Verdict.ACK
    else:
        verdict = Verdict.SUBSCRIPTION
    if wildcard_type:
        # Wildcard types are always served whole: a named subscription adds nothing to send, and
        # leaving "*" is recorded (debug pages) while the whole type is still served.
        rejoins = WILDCARD in subscribe and not watch.wildcard
        if WILDCARD in unsubscribe and WILDCARD not in subscribe:
            watch.wildcard = False
        elif rejoins:
            watch.wildcard = True
        return Decision(verdict, rejoins)
    if added:
        return Decision(verdict, True, added)
    return Decision(verdict, False)


def _first(
    conn: Connection,
    type_url: str,
    wildcard_type: bool,
    subscribe: Sequence[str],
    unsubscribe: Sequence[str],
    initial_versions: Mapping[str, str],
) -> Decision:
    names = (frozenset(subscribe) | frozenset(initial_versions)) - frozenset(unsubscribe) - {WILDCARD}
    if len(names) > MAX_SUBSCRIPTIONS:
        raise RefusedRequest(
            f"{len(names)} subscriptions for {type_url} (at most {MAX_SUBSCRIPTIONS})", exhausted=True
        )
    # "A client that never subscribed to a name is subscribed to *" (the xDS protocol).
    wildcard = wildcard_type and (WILDCARD in subscribe or not subscribe)
    held: dict[str, int] = {}
    for name, text in initial_versions.items():
        version = parse_version(text)
        if version is not None and (wildcard_type or name in names):
            # Interned: every proxy of a reconnect storm names the same resources; held per proxy
            # as its own strings they cost hundreds of megabytes at 2,000 proxies.
            held[sys.intern(name)] = version
    conn.watched[type_url] = WatchedResource(
        type_url, names=shared_names(names), wildcard=wildcard, versions=held
    )
    return Decision(Verdict.INITIAL, True)


@dataclass(frozen=True, slots=True)
class Changes:
    """What one delta response carries."""

    #: (resource, its version) for each resource the proxy does not hold as it is.
    updated: list[tuple[Resource, int]]
    #: Names the proxy holds that no longer exist.
    removed: list[str]

    def __bool__(self) -> bool:
        return bool(self.updated or self.removed)


def changes(watch: WatchedResource, resources: list[Resource], *, whole: bool) -> Changes:
    """The difference between what the proxy holds and ``resources``.

    ``whole``: ``resources`` is everything the watch should hold, so a held name missing from it
    was removed; otherwise it is a part (an endpoint push, newly subscribed names) and removes nothing.
    """
    held = watch.versions
    updated = []
    for resource in resources:
        version = resource.version
        if held.get(resource.name) != version:
            updated.append((resource, version))
    removed: list[str] = []
    if whole and len(held) + len(updated) > len(resources):
        present = names_of(resources)
        removed = sorted(name for name in held if name not in present)
    return Changes(updated, removed)


def record_sent(watch: WatchedResource, sent: Changes) -> None:
    """The proxy now holds what ``sent`` carried."""
    held = watch.versions
    for resource, version in sent.updated:
        held[resource.name] = version
    for name in sent.removed:
        held.pop(name, None)


def forget(watch: WatchedResource, names: frozenset[str] | set[str]) -> None:
    """Resend ``names`` at the next response even if unchanged (EDS for clusters CDS just updated:
    Envoy warms an updated cluster until its assignment arrives again)."""
    held = watch.versions
    for name in names:
        held.pop(name, None)
