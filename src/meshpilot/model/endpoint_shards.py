"""The data the EndpointIndex holds and answers with, shared by its compiled and Python twins."""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass, field

from meshpilot.model.endpoint import Endpoint


class PushType(enum.IntEnum):
    """What an endpoint update requires, in increasing order of cost."""

    NO_PUSH = 0
    #: Only EDS for this service, to proxies that watch it.
    INCREMENTAL = 1
    #: A full push: a new service appeared or its set of identities changed,
    #: which changes clusters' SANs (CDS).
    FULL = 2


@dataclass(frozen=True, slots=True, order=True)
class ShardKey:
    """Where endpoints came from: the registry provider and the cluster."""

    cluster: str
    provider: str

    def __str__(self) -> str:
        return f"{self.provider}/{self.cluster}"


@dataclass(slots=True)
class EndpointShards:
    """All endpoints of one (hostname, namespace), per shard.

    Identities are kept per shard, so the service's set is a union over its
    few shards rather than a walk over every endpoint.
    """

    shards: dict[ShardKey, tuple[Endpoint, ...]] = field(default_factory=dict)
    shard_accounts: dict[ShardKey, frozenset[str]] = field(default_factory=dict)
    service_accounts: frozenset[str] = frozenset()
    #: Bumped on every change.
    version: int = 0

    def endpoints(self) -> Iterator[tuple[ShardKey, Endpoint]]:
        """Every endpoint, shards in sorted order so output is deterministic."""
        for key in sorted(self.shards):
            for ep in self.shards[key]:
                yield key, ep

    def set_shard(self, key: ShardKey, endpoints: tuple[Endpoint, ...], accounts: frozenset[str]) -> bool:
        """Replace one shard; True when the service's identities changed."""
        self.shards[key] = endpoints
        self.shard_accounts[key] = accounts
        self.version += 1
        return self._refresh_accounts()

    def remove_shard(self, key: ShardKey) -> bool:
        """Drop one shard; True when the service's identities changed."""
        self.shards.pop(key, None)
        self.shard_accounts.pop(key, None)
        self.version += 1
        return self._refresh_accounts()

    def _refresh_accounts(self) -> bool:
        accounts = frozenset().union(*self.shard_accounts.values())
        changed = accounts != self.service_accounts
        self.service_accounts = accounts
        return changed
