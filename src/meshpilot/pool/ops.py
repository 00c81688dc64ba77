"""The messages of the change log, from the main process to its push workers: plain data, applied
in order. A worker that applies the same messages in the same order holds the same model as the main
process, and so serves the same bytes a single process would.

``target`` names where an object goes in the worker: ``LOCAL`` is the local cluster's router (Istio
config to the store, Secrets to the credentials, other objects to the Kubernetes registry); any other
value is a remote cluster's registry, by cluster ID.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from meshpilot.config.decode import Decoded
from meshpilot.model.config import ConfigKey
from meshpilot.model.kind import Kind
from meshpilot.model.push_request import PushRequest, TriggerReason

LOCAL = ""


@dataclass(frozen=True, slots=True)
class Upsert:
    target: str
    obj: Decoded


@dataclass(frozen=True, slots=True)
class Remove:
    target: str
    kind: Kind
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class BatchStart:
    target: str


@dataclass(frozen=True, slots=True)
class BatchEnd:
    target: str


@dataclass(frozen=True, slots=True)
class Attach:
    """A remote cluster's registry joins (multicluster secrets)."""

    cluster: str


@dataclass(frozen=True, slots=True)
class Detach:
    cluster: str


@dataclass(frozen=True, slots=True)
class Mesh:
    """A new MeshConfig (a protobuf message: it pickles as its bytes)."""

    mesh: Any


@dataclass(frozen=True, slots=True)
class JwksKeys:
    """Every JWKS the main process holds, after one was fetched or changed (``pool.jwks``)."""

    keys: dict[tuple[str, str], str]


@dataclass(frozen=True, slots=True)
class Authority:
    """The mesh CA's key and certificates as the files of a plugged-in CA (``ca.keys``), so that
    the worker's secure ports and CreateCertificate sign as the main process does."""

    files: dict[str, bytes] = field(repr=False)  # the CA's key: never in a log line


@dataclass(frozen=True, slots=True)
class Start:
    """The model is loaded: build the first snapshot, under the main process's version, and serve.
    ``push_seq``: the number of the last push sent before it (the admission gate's reference);
    ``number``: its record's number in the main process's push history (a worker's own pushes are
    named after it: ``PushHistory.follow``)."""

    version: str
    push_seq: int
    number: int = 0


@dataclass(frozen=True, slots=True)
class Push:
    """A debounced push the main process started; ``version`` is its snapshot's (full pushes)."""

    seq: int
    version: str
    full: bool
    forced: bool
    configs_updated: frozenset[ConfigKey]
    reasons: dict[TriggerReason, int]
    #: ``time.monotonic()`` of the first change behind it: one clock for every process of a machine,
    #: so the workers' convergence and queue times count the debounce, as one process's do.
    start: float = 0.0
    #: The number of the main process's record of it (``PushHistory``): the workers' records of
    #: the same push take it, so ``/debug/ui`` and ``explain`` name one push by one number.
    number: int = 0

    @classmethod
    def of(cls, seq: int, request: PushRequest, number: int) -> Push:
        version = request.push.version if request.push is not None else ""
        return cls(
            seq,
            version,
            request.full,
            request.forced,
            request.configs_updated,
            dict(request.reasons),
            request.start,
            number,
        )

    def request(self) -> PushRequest:
        return PushRequest(
            full=self.full,
            configs_updated=self.configs_updated,
            reasons=Counter(self.reasons),
            forced=self.forced,
            start=self.start,
        )


Op = Upsert | Remove | BatchStart | BatchEnd | Attach | Detach | Mesh | JwksKeys | Authority | Start | Push


@dataclass(frozen=True, slots=True)
class Call:
    """A question, answered by a ``Reply``: from the main process to a worker (its debug pages, its
    metrics) or from a worker to the main process (the whole pool's debug answers; ``pool.calls``)."""

    id: int
    name: str
    args: tuple[Any, ...] = ()


# -- from a worker to the main process ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ready:
    """The worker applied the log up to Start and serves."""


@dataclass(frozen=True, slots=True)
class Reply:
    """The answer to a ``Call``, either way."""

    id: int
    value: Any = None
    error: str = ""
