"""Change preview: what applying a change would push, worked out before anything is applied.

A change (Istio objects to add or update, or to delete) is first checked as the validating webhook
checks it (``webhooks.validate.ValidationHandler``, so a change the API server would refuse is
refused here with the same message). It is then applied to a copy of the server's config, never to
the live store: a scratch ``ConfigStore`` holding the live objects plus the change, and, when the
change touches ServiceEntries or WorkloadEntries, a scratch ``ServiceEntryRegistry`` and a copy of the
EndpointIndex it writes to. Two private PushContexts are built, one from the config as it is and one
with the change, neither sharing memos with the live one (``keep_lasting=False``), each with an
XdsCache of its own, so nothing the live pushes read is touched. Two more things generation would
otherwise do to the live server are kept from it: JWKS are read from what the resolver already holds
(a preview never makes it fetch), and problems met while generating (``PolicyProblems``) are
reported in the answer, not logged and counted as the server's.

For every connected proxy the push scoping the server applies decides whether the change concerns
it (``xds.dependencies.proxy_needs_push`` after the same refresh a push does, and each generator's
``needs_push``); then each type the proxy watches is generated from both snapshots with the server's
own generators, and the resources are compared by name and bytes: what would change, appear and
disappear, with a unified diff of each changed resource rendered as JSON with sorted keys (secrets
hidden as in config dumps). A proxy whose config would change although the scoping says the change
does not concern it is reported apart (``unscoped``): the push would not send it that config.

The work runs on the server's event loop in slices (``preview_scratch.SLICE_SECONDS``): it may
yield between any two generations, so a preview over thousands of proxies delays other work by one
slice at a time, not by its whole duration. Everything it reads of the live server (config
snapshot, services, endpoint index, proxies and their watches) is taken before its first yield, so
what it computes is consistent even when a push happens meanwhile.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
import hashlib
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from google.protobuf import any_pb2, json_format

from meshpilot.model.proxy import Proxy
from meshpilot.model.push_request import (
    PushRequest,
)
from meshpilot.networking.policy_problems import PolicyProblems
from meshpilot.push.preview_change import Change
from meshpilot.push.preview_scratch import PreviewSources, Slicer, Snapshots, scratch
from meshpilot.xds.connection import Connection, WatchedResource
from meshpilot.xds.dependencies import proxy_needs_push
from meshpilot.xds.generators.base import GenerationContext, Generator, Resource, digest_of
from meshpilot.xds.redaction import redact_message
from meshpilot.xds.types import PUSH_ORDER, TypeUrl, parse_type_url

#: A diff longer than this is cut, with a line saying how much was left out.
MAX_DIFF_LINES = 400
#: The largest change body accepted (the webhook's own limit on a review is larger; a preview is
#: meant for a handful of objects).
MAX_BODY_BYTES = 4 * 1024 * 1024
#: Problems listed at most.
MAX_PROBLEMS = 100

#: Types a config change never changes (Secrets) or that are never pushed (debug).
_NOT_PREVIEWED = frozenset({TypeUrl.SECRET, TypeUrl.DEBUG, TypeUrl.DEBUG_SYNCZ, TypeUrl.DEBUG_CONFIG_DUMP})


# -- comparing ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResourceChange:
    type: str
    name: str
    #: "changed", "added" or "removed".
    change: str
    #: Key of the diff in the result's ``diffs`` (changed resources only).
    diff: str = ""

    def as_json(self) -> dict[str, str]:
        out = {"type": self.type, "name": self.name, "change": self.change}
        if self.diff:
            out["diff"] = self.diff
        return out


@dataclass(slots=True)
class ProxyOutcome:
    proxy: str
    connection: str
    protocol: str
    in_scope: bool
    changes: list[ResourceChange] = field(default_factory=list)
    #: Types a state-of-the-world stream would send although no resource changed (their order did).
    reordered: list[str] = field(default_factory=list)
    #: Endpoints a delta stream sends again because their cluster changed (Envoy warms it).
    warming: list[str] = field(default_factory=list)

    @property
    def pushed(self) -> bool:
        return self.in_scope and bool(self.changes or self.reordered)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "proxy": self.proxy,
            "connection": self.connection,
            "protocol": self.protocol,
            "types": sorted({c.type for c in self.changes} | set(self.reordered)),
            "resources": [c.as_json() for c in self.changes],
        }
        if self.reordered:
            out["reordered"] = self.reordered
        if self.warming:
            out["warming"] = self.warming
        return out


class _Diffs:
    """Unified diffs of changed resources, made once per distinct (before, after) pair."""

    def __init__(self) -> None:
        self.by_key: dict[str, str] = {}
        self._rendered: dict[bytes, list[str]] = {}

    def add(self, short: str, name: str, before: bytes, after: bytes) -> str:
        digest = hashlib.blake2b(before + b"\0" + after, digest_size=8).hexdigest()
        key = f"{short}/{name}@{digest}"
        if key not in self.by_key:
            lines = list(
                difflib.unified_diff(
                    self._lines(before),
                    self._lines(after),
                    fromfile=f"{short}/{name} (now)",
                    tofile=f"{short}/{name} (with the change)",
                    lineterm="",
                )
            )
            if len(lines) > MAX_DIFF_LINES:
                left = len(lines) - MAX_DIFF_LINES
                lines = [*lines[:MAX_DIFF_LINES], f"... {left} more lines"]
            self.by_key[key] = "\n".join(lines) + "\n"
        return key

    def _lines(self, payload: bytes) -> list[str]:
        found = self._rendered.get(payload)
        if found is None:
            found = self._rendered[payload] = render(payload).splitlines()
        return found


def render(payload: bytes) -> str:
    """A resource (a serialized ``Any``) as JSON with sorted keys, secrets hidden."""
    message = any_pb2.Any.FromString(payload)
    redact_message(message)
    data = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()


#: (kind, namespace/name, message) of a problem met while generating (``PolicyProblems.record``).
Problem = tuple[str, str, str]


@contextlib.contextmanager
def captured_problems(into: set[Problem]) -> Iterator[None]:
    """Problems generation reports go to ``into`` instead of the server's log and
    ``meshpilot_policy_problems``-style tallies: a preview's config is not the server's.

    The tallies are module globals reached from deep inside the generators, so the method is
    swapped on the class, for one synchronous call (no ``await`` inside): on this thread, the one
    the server generates on, nothing else runs meanwhile. Another thread that reports a problem
    in that window still reaches the server's tally.
    """
    original = PolicyProblems.record
    thread = threading.get_ident()

    def record(self: PolicyProblems, kind: str, name: str, message: str) -> None:
        if threading.get_ident() == thread:
            into.add((kind, name, message))
        else:
            original(self, kind, name, message)

    setattr(PolicyProblems, "record", record)  # noqa: B010 (mypy refuses assigning a method)
    try:
        yield
    finally:
        setattr(PolicyProblems, "record", original)  # noqa: B010


def _generate(
    generator: Generator, context: GenerationContext, watch: WatchedResource, problems: set[Problem]
) -> list[Resource] | None:
    """One generation for one of the two snapshots, its problems kept in ``problems``."""
    with captured_problems(problems):
        return generator.generate(context, watch, None)


def _by_name(resources: list[Resource] | None) -> dict[str, bytes]:
    return {r.name: r.payload for r in resources or ()}


async def _compare(
    in_scope: bool,
    proxy_before: Proxy,
    proxy_after: Proxy,
    conn: Connection,
    watched: Mapping[str, WatchedResource],
    generators: Mapping[TypeUrl, Generator],
    snaps: Snapshots,
    request: PushRequest,
    diffs: _Diffs,
    problems: tuple[set[Problem], set[Problem]],
    slicer: Slicer,
) -> ProxyOutcome:
    """One proxy: each watched type generated from both snapshots, in the order pushes send them.
    The loop may run other work between any two generations (``slicer``)."""
    outcome = ProxyOutcome(proxy_after.id, conn.id, conn.protocol, in_scope)
    context_before = GenerationContext(
        proxy_before,
        snaps.before,
        snaps.index_before,
        dataclasses.replace(request, push=snaps.before),
        snaps.cache_before,
        conn.identity,
    )
    context_after = GenerationContext(
        proxy_after,
        snaps.after,
        snaps.index_after,
        dataclasses.replace(request, push=snaps.after),
        snaps.cache_after,
        conn.identity,
    )
    ordered = [t for t in PUSH_ORDER if t in watched] + [t for t in watched if t not in PUSH_ORDER]
    updated_clusters: set[str] = set()
    for type_url in ordered:
        known = parse_type_url(type_url)
        generator = generators.get(known) if known is not None else None
        if known is None or generator is None or known in _NOT_PREVIEWED:
            continue
        if not generator.needs_push(request):
            continue
        watch = watched[type_url]
        old = _generate(generator, context_before, watch, problems[0])
        await slicer.pause()
        new = _generate(generator, context_after, watch, problems[1])
        await slicer.pause()
        if new is None:
            continue
        # The same payloads in the same order: nothing to send (the test a state-of-the-world push
        # makes too). Lists shared by a scope's proxies carry their digest, so most proxies stop here.
        if old is not None and digest_of(old) == digest_of(new):
            continue
        before, after = _by_name(old), _by_name(new)
        whole = request.full or known.is_wildcard
        short = known.short
        found = len(outcome.changes)
        for name, payload in after.items():
            was = before.get(name)
            if was is None:
                outcome.changes.append(ResourceChange(short, name, "added"))
            elif was != payload:
                outcome.changes.append(
                    ResourceChange(short, name, "changed", diffs.add(short, name, was, payload))
                )
        if whole:
            outcome.changes += [ResourceChange(short, n, "removed") for n in before if n not in after]
        if len(outcome.changes) == found and whole and list(before) != list(after):
            outcome.reordered.append(short)
        if known is TypeUrl.CLUSTER:
            updated_clusters = {c.name for c in outcome.changes[found:] if c.change != "removed"}
    eds = watched.get(TypeUrl.ENDPOINT)
    # Only a delta stream resends them unasked (``DeltaStream._send``); Envoy over state-of-the-world
    # asks for them again itself.
    if eds is not None and updated_clusters and conn.protocol == "delta":
        changed_eds = {c.name for c in outcome.changes if c.type == "eds"}
        outcome.warming = sorted((updated_clusters & eds.names) - changed_eds)
    return outcome


def watched_copy(conn: Connection) -> dict[str, WatchedResource]:
    """What ``conn`` watches, copied: its stream goes on changing its own."""
    return {t: WatchedResource(w.type_url, w.names, wildcard=w.wildcard) for t, w in conn.watched.items()}


async def preview(sources: PreviewSources, change: Change, *, scope: str = "") -> dict[str, Any]:
    """What pushing ``change`` would send to the connected proxies (of ``scope``'s namespace when
    given), as a JSON-ready dict."""
    started = time.monotonic()
    slicer = Slicer()
    out: dict[str, Any] = {
        "valid": change.valid,
        "errors": change.errors,
        "warnings": change.warnings,
        "objects": [o.as_json() for o in change.objects],
    }
    if not change.valid:
        return out
    server = sources.server
    # Taken at once, before the first yield: the proxies as the last push left them.
    live = (
        list(server.connections.values()) if sources.connections is None else await sources.connections(scope)
    )
    conns = [
        (conn, copy.copy(conn.proxy), watched_copy(conn))
        for conn in sorted(live, key=lambda c: c.id)
        if not scope or conn.proxy.config_namespace == scope
    ]
    snaps = await scratch(sources, change, slicer)
    request = snaps.request
    out["push"] = (
        {
            "full": request.full,
            "reasons": {r.value: n for r, n in sorted(request.reasons.items(), key=lambda i: i[0].value)},
            "configsUpdated": sorted(
                f"{k.kind.value}/{k.namespace}/{k.name}" for k in request.configs_updated
            ),
        }
        if request is not None
        else None
    )
    diffs = _Diffs()
    problems: tuple[set[Problem], set[Problem]] = (set(), set())
    pushed: list[ProxyOutcome] = []
    scoped_out: list[ProxyOutcome] = []
    quiet: list[str] = []
    # No request: nothing in the change differs from the live config, so nothing is pushed.
    for conn, proxy, watched in conns if request is not None else ():
        assert request is not None
        before = copy.copy(proxy)
        snaps.before_env.refresh_proxy(before, snaps.before)
        after = copy.copy(proxy)
        # As the push decides: a full push refreshes the proxy first, an endpoint push does not.
        if request.full:
            snaps.after_env.refresh_proxy(after, snaps.after)
        in_scope = proxy_needs_push(after, request, snaps.after.mesh.root_namespace)
        if not request.full:
            # Generated with a scope of the preview's own snapshot (the same content): the live
            # scope's memo is the server's.
            after = copy.copy(proxy)
            snaps.after_env.refresh_proxy(after, snaps.after)
        outcome = await _compare(
            in_scope,
            before,
            after,
            conn,
            watched,
            server.generators_for(proxy),
            snaps,
            request,
            diffs,
            problems,
            slicer,
        )
        if outcome.pushed:
            pushed.append(outcome)
        elif outcome.changes:
            scoped_out.append(outcome)
        elif outcome.in_scope:
            quiet.append(conn.id)
        await slicer.pause()
    slicer.end()
    out.update(
        {
            "proxies": {
                "considered": len(conns),
                "inScope": len(pushed) + len(quiet),
                "pushed": len(pushed),
            },
            "pushes": [o.as_json() for o in pushed],
            "inScopeUnchanged": quiet,
            "unscoped": [o.as_json() for o in scoped_out],
            "diffs": diffs.by_key,
            # What generating with the change met (a rule skipped, a patch that failed), marked
            # when generating without it did not meet it.
            "problems": [
                {
                    "kind": kind,
                    "name": name,
                    "message": message,
                    "new": (kind, name, message) not in problems[0],
                }
                for kind, name, message in sorted(problems[1])
            ][:MAX_PROBLEMS],
            "timing": {
                "seconds": round(time.monotonic() - started, 4),
                "longestBlockSeconds": round(slicer.longest, 4),
            },
        }
    )
    return out
