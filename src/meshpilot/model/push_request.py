"""A request to push config to proxies, and how requests merge while debounced."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from meshpilot.model.config import ConfigKey
from meshpilot.model.identity import IdentityEnum
from meshpilot.model.kind import Kind

if TYPE_CHECKING:
    from meshpilot.model.push_context import PushContext

T = TypeVar("T")


class TriggerReason(IdentityEnum):
    """Why a push happened; the ``type`` label of ``pilot_push_triggers``."""

    ENDPOINT = "endpoint"
    #: Endpoints of a headless service changed: its per-address listeners follow.
    HEADLESS_ENDPOINT = "headlessendpoint"
    CONFIG = "config"
    SERVICE = "service"
    PROXY = "proxy"
    GLOBAL = "global"
    UNKNOWN = "unknown"
    DEBUG = "debug"
    #: A Secret served over SDS changed (or who may read it).
    SECRET = "secret"
    INITIAL = "initial"


@dataclass(slots=True)
class PushRequest:
    """What changed, so each proxy can tell whether and what to push.

    ``full`` means any config may have changed (CDS, LDS and RDS are rebuilt);
    otherwise only endpoints of the hosts named in ``configs_updated`` changed
    and only EDS is sent. An empty ``configs_updated`` on a full push means
    "anything may have changed", which is also what ``forced`` says.
    """

    full: bool = True
    configs_updated: frozenset[ConfigKey] = frozenset()
    reasons: Counter[TriggerReason] = field(default_factory=Counter)
    forced: bool = False
    #: time.monotonic() of the first change that led to this request.
    start: float = field(default_factory=time.monotonic)
    #: The snapshot to push; set by the server when the push starts.
    push: PushContext | None = None
    #: When the push started (after the cache evictions it caused); XdsCache writes
    #: of generations for this request carry it, so stale ones are dropped.
    token: int = 0
    #: The number of its record in the push history (``PushHistory.started``): set on the request
    #: ``start_push`` was given, for its listeners; merging does not carry it.
    number: int = 0
    #: What ``updated_kinds`` and ``memoized`` hold once asked: worked out once per request, not once
    #: per proxy of the push (a push reaches thousands of streams with the same request). Not
    #: constructor fields, so ``dataclasses.replace`` starts a copy without them: the copy may name
    #: other configs or another snapshot.
    _kinds: frozenset[Kind] | None = field(default=None, init=False, compare=False, repr=False)
    _memo: dict[Hashable, Any] | None = field(default=None, init=False, compare=False, repr=False)

    @property
    def updated_kinds(self) -> frozenset[Kind]:
        """The kinds of ``configs_updated``."""
        kinds = self._kinds
        if kinds is None:
            kinds = self._kinds = frozenset(key.kind for key in self.configs_updated)
        return kinds

    def memoized(self, key: Hashable, make: Callable[[], T]) -> T:
        """``make()`` once per request for ``key``: what every stream of a push would work out alike
        from the request alone (or with objects the key names by identity: ``memoized_by_identity``)."""
        memo = self._memo
        if memo is None:
            memo = self._memo = {}
        try:
            found: T = memo[key]
        except KeyError:
            found = memo[key] = make()
        return found

    def merge(self, other: PushRequest) -> PushRequest:
        """A request that covers both; the later snapshot wins, the earlier start stays."""
        return merge_all((self, other))

    @property
    def is_everything(self) -> bool:
        """True when nothing narrows what may have changed."""
        return self.forced or (self.full and not self.configs_updated)

    def reason_text(self) -> str:
        return ",".join(f"{r.value}:{n}" for r, n in sorted(self.reasons.items(), key=lambda i: i[0].value))


def config_request(key: ConfigKey) -> PushRequest:
    """The request a changed Istio object makes (the server's store handler, and a preview of it)."""
    return PushRequest(
        full=True, configs_updated=frozenset({key}), reasons=Counter({TriggerReason.CONFIG: 1})
    )


def registry_request(key: ConfigKey, reason: TriggerReason, *, full: bool = True) -> PushRequest:
    """The request a registry's change to the service ``key`` makes: its endpoints (ENDPOINT, full
    when the change also needs config rebuilt) or the service itself (SERVICE). The server's
    ``XdsUpdater`` and a preview's scratch updater both build it here."""
    return PushRequest(full=full, configs_updated=frozenset({key}), reasons=Counter({reason: 1}))


def merge_all(requests: Sequence[PushRequest]) -> PushRequest:
    """What merging ``requests`` pairwise in order gives, with the changed keys united once.

    Pairwise, each merge copies the keys gathered so far: a burst of 10,000 changes (one file
    of ServiceEntries) then costs 50 million copies.
    """
    first = requests[0]
    if len(requests) == 1:
        return first
    keys: set[ConfigKey] = set()
    reasons: Counter[TriggerReason] = Counter()
    push = None
    # A full request naming no keys means "anything may have changed" (a MeshConfig change): merged
    # with narrower ones it must stay that, not become their keys (istiod's Merge does the same).
    everything = False
    for request in requests:
        everything = everything or (request.full and not request.configs_updated)
        keys.update(request.configs_updated)
        reasons.update(request.reasons)
        if request.push is not None:
            push = request.push
    return PushRequest(
        full=any(r.full for r in requests),
        configs_updated=frozenset() if everything else frozenset(keys),
        reasons=reasons,
        forced=any(r.forced for r in requests),
        start=min(r.start for r in requests),
        push=push,
        token=max(r.token for r in requests),
    )
