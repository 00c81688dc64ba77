"""Per-stream state: the proxy, what it watches, and what was sent and acknowledged."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from meshpilot.model.proxy import Proxy

_ids = itertools.count(1)


@dataclass(slots=True)
class WatchedResource:
    """One subscription of a stream: a type URL and the names asked for."""

    type_url: str
    #: Requested names; empty for a wildcard subscription.
    names: frozenset[str] = frozenset()
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


@dataclass(slots=True)
class Connection:
    """One ADS stream."""

    proxy: Proxy
    peer: str
    id: str = ""
    connected_at: float = field(default_factory=time.time)
    watched: dict[str, WatchedResource] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.id:
            self.id = f"{self.proxy.id}-{next(_ids)}"

    def watch(self, type_url: str) -> WatchedResource | None:
        return self.watched.get(type_url)
