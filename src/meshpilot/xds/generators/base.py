"""What a generator is: a pure function of the proxy, the push context, the index and the watch."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from google.protobuf import any_pb2

from meshpilot.model.endpoint_index import EndpointIndex
from meshpilot.model.kind import Kind
from meshpilot.model.proxy import Proxy
from meshpilot.model.push_context import PushContext
from meshpilot.model.push_request import PushRequest
from meshpilot.model.sidecar_scope import SidecarScope
from meshpilot.networking import wire
from meshpilot.networking.protobuf import TYPE_PREFIX, serialize
from meshpilot.xds.cache import XdsCache, new_token
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.types import TypeUrl

T = TypeVar("T")


def payload_version(payload: bytes) -> int:
    """A resource's version for delta xDS: 64 bits of BLAKE2b of its bytes. The same in every
    process, so a proxy that reconnects to a restarted server, another replica or another push
    worker is sent only what changed; per resource object it is computed once (``Resource.version``)."""
    return int.from_bytes(hashlib.blake2b(payload, digest_size=8).digest(), "big")


@dataclass(frozen=True, slots=True)
class Resource:
    name: str
    #: The resource as a serialized ``google.protobuf.Any``, ready for a DiscoveryResponse.
    payload: bytes
    # Delta bookkeeping, computed at most once per object and reused for every proxy the object is
    # sent to (lists of resources are shared by the proxies of a scope): see ``version`` and
    # ``delta_wire``. Caches on a frozen object, so set through object.__setattr__.
    _version: int | None = field(default=None, compare=False, repr=False)
    delta_prefix: bytes | None = field(default=None, compare=False, repr=False)

    @property
    def version(self) -> int:
        version = self._version
        if version is None:
            version = payload_version(self.payload)
            object.__setattr__(self, "_version", version)
        return version

    @classmethod
    def of(cls, name: str, message: Any) -> Resource:
        """A resource from a protobuf message (the builders' slow path)."""
        return cls(name, wire.any_bytes(TYPE_PREFIX + message.DESCRIPTOR.full_name, serialize(message)))

    def message(self) -> Any:
        """The resource parsed back into an ``Any`` (for debug output)."""
        return any_pb2.Any.FromString(self.payload)


class ResourceList(list[Resource]):
    """Generated resources with a digest of their payloads, computed once per list.

    A push that would send a proxy what it already holds is skipped by
    comparing digests (see AdsStream._send). Lists shared by many proxies
    (the outbound clusters of a scope) pay for their digest once; a proxy's
    own list joins the shared parts' digests instead of hashing a thousand
    payloads again. Treated as immutable once made.
    """

    __slots__ = ("_digest", "_names")

    def __init__(
        self, items: Iterable[Resource] = (), digest: int | None = None, names: frozenset[str] | None = None
    ) -> None:
        """``names``: the resources' names when already known (a copy with other payloads)."""
        super().__init__(items)
        self._digest = digest
        self._names = names

    @property
    def names(self) -> frozenset[str]:
        """The resource names, one set however many proxies are sent the list."""
        if self._names is None:
            self._names = frozenset(r.name for r in self)
        return self._names

    @property
    def digest(self) -> int:
        if self._digest is None:
            # bytes cache their hash, and shared payloads are hashed once in all.
            self._digest = hash(tuple([r.payload for r in self]))
        return self._digest

    @classmethod
    def joined(cls, first: ResourceList, second: ResourceList) -> ResourceList:
        out = cls(digest=hash((first.digest, second.digest)))
        out += first
        out += second
        return out


#: A memo's lookup: ``PushContext.memoized`` (per snapshot) or ``PushRequest.memoized`` (per request).
Memo = Callable[[Hashable, Callable[[], Any]], Any]


def memoized_by_identity(memo: Memo, key: Hashable, inputs: tuple[object, ...], make: Callable[[], T]) -> T:
    """``make()`` once per ``memo`` entry for ``key``, whose parts include the ``id()`` of each of
    ``inputs`` (objects that are not hashable, or whose equality costs more than building again).

    The entry holds the inputs, so no other object can take one of their ids while it lives; the
    identity check on a hit stands guard for a key that names other ids than ``inputs``."""
    entry: tuple[tuple[object, ...], T] = memo(key, lambda: (inputs, make()))
    held, out = entry
    # A loop, not any() over a generator: this runs per proxy of a push, where the generator's
    # setup cost more than the comparisons.
    for a, b in zip(held, inputs, strict=True):
        if a is not b:
            return make()
    return out


def shared_token(
    push: PushContext, scope: SidecarScope, purpose: str, signature: Callable[[], Hashable]
) -> int:
    """A token naming ``scope``'s ``purpose`` output in memo keys, the same for every scope of this
    snapshot whose ``signature()`` is equal: namespaces without a Sidecar of their own usually import
    the same, so a full push builds such outputs once instead of once per namespace. ``signature()``
    names all the output reads of a scope, objects by ``id``; it is asked once per scope.

    The memo entry holds the first scope with the signature, and with it the objects whose ids the
    signature names, so no other object takes one of those ids while the entry lives. Tokens are never
    reused: a scope of an older snapshot (a proxy answered before its next refresh) keeps its own and
    cannot meet another scope's in a newer snapshot's memo."""
    held = ("shared-token", purpose)
    found = scope.memo.get(held)
    if found is None:
        entry: tuple[SidecarScope, int] = push.memoized(
            (*held, signature()), lambda: (scope, next(_SHARED_TOKENS))
        )
        found = scope.memo[held] = entry[1]
    assert isinstance(found, int)
    return found


_SHARED_TOKENS = itertools.count()


def joined(push: PushContext, first: ResourceList, second: ResourceList) -> ResourceList:
    """``first`` then ``second``, one list per pair, for parts the proxies of a scope share: they then
    share the joined list too, with its digest and names (joining a thousand clusters again for every
    proxy was most of a push's per-proxy CDS time). The joined list is carried to the next snapshot
    while both parts are the same objects (``same_list`` keeps them so while their content is), so a
    push that changes neither part joins nothing again. Parts made for one proxy are joined with
    ``ResourceList.joined``: an entry per proxy would only hold memory."""
    # The entry holds the parts, so no other list takes their ids while it lives.
    held: tuple[ResourceList, ResourceList, ResourceList] = push.carried(
        ("joined", id(first), id(second)), lambda: (first, second, ResourceList.joined(first, second))
    )
    return held[2]


def same_list(push: PushContext, made: ResourceList) -> ResourceList:
    """The previous snapshot's list if it holds the same resources as ``made`` (a list shared by the
    proxies of a scope, built again for a new snapshot), else ``made``: kept so, a list stays the same
    object while its content does, and what is keyed by it (``joined``) is found again."""
    kept: ResourceList = push.carried(("same-list", made.digest, len(made)), lambda: made)
    if kept is made or not _same_resources(kept, made):
        return made
    return kept


def _same_resources(a: ResourceList, b: ResourceList) -> bool:
    # Payloads from the XdsCache are the same objects, and ``==`` on bytes looks at identity first.
    if len(a) != len(b):
        return False
    return all(x.name == y.name and x.payload == y.payload for x, y in zip(a, b, strict=True))


def digest_of(resources: list[Resource]) -> int:
    return resources.digest if isinstance(resources, ResourceList) else ResourceList(resources).digest


def names_of(resources: list[Resource]) -> frozenset[str]:
    return resources.names if isinstance(resources, ResourceList) else frozenset(r.name for r in resources)


# Not frozen: one is made per proxy and type of every push, and a frozen dataclass's constructor
# (a field at a time through object.__setattr__) cost 2.2 µs of it here, four times a plain one's.
# Nothing assigns to it once made.
@dataclass(slots=True)
class GenerationContext:
    proxy: Proxy
    push: PushContext
    index: EndpointIndex
    request: PushRequest
    #: Where generated resources are kept for other proxies; None disables caching.
    cache: XdsCache | None = None
    #: The SPIFFE identity the stream proved on the secure port (``Connection.identity``); "" on the
    #: plaintext port. Only SDS reads it: who may have a Secret's key.
    identity: str = ""

    @property
    def token(self) -> int:
        return self.request.token or new_token()


class Generator(Protocol):
    type_url: TypeUrl

    def needs_push(self, request: PushRequest) -> bool:
        """Whether a change (as the request describes it) can change this type's resources. Reads
        the request only: a push asks once for all the streams with the same generators."""

    def generate(
        self, ctx: GenerationContext, watch: WatchedResource, names: frozenset[str] | None
    ) -> list[Resource] | None:
        """Resources to send; ``names`` narrows a non-wildcard type to those names.

        None means "nothing to send for this request" (as opposed to an empty
        list, which for a wildcard type means "you have no resources").
        """


@runtime_checkable
class KeepsUnchanged(Protocol):
    """A generator that can tell, for a proxy, that a full push leaves its resources as they were."""

    def kept_for(self, proxy: Proxy, request: PushRequest) -> bool:
        """Whether ``request``'s changes leave this type's resources for ``proxy`` as they were, so
        the push need not build them again to find that out. Asked after the proxy's refresh, while
        its previous scope is still held (``Proxy.previous_scope``).

        The answer may read of the proxy only its type, its scope, its previous scope and whether
        the refresh read its workload again (``ProxyState.workload_reread``): a push asks once for
        all the proxies alike in these and applies the answer to each (``Stream._keep``)."""


def only_kinds(request: PushRequest, skipped: frozenset[Kind]) -> bool:
    """True when every updated config is of a kind in ``skipped``, so the push can skip this type."""
    if request.is_everything:
        return False
    return request.updated_kinds <= skipped
