"""The EndpointIndex: every service's endpoints, sharded by where they came from.

Endpoints are kept out of the PushContext so that an endpoint change updates
this index in place and pushes EDS only, without rebuilding the snapshot.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
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
    """All endpoints of one (hostname, namespace), per shard."""

    shards: dict[ShardKey, tuple[Endpoint, ...]] = field(default_factory=dict)
    service_accounts: frozenset[str] = frozenset()

    def endpoints(self) -> Iterator[tuple[ShardKey, Endpoint]]:
        """Every endpoint, shards in sorted order so output is deterministic."""
        for key in sorted(self.shards):
            for ep in self.shards[key]:
                yield key, ep

    def _recompute_service_accounts(self) -> bool:
        accounts = frozenset(
            ep.service_account for eps in self.shards.values() for ep in eps if ep.service_account
        )
        changed = accounts != self.service_accounts
        self.service_accounts = accounts
        return changed


class EndpointIndex:
    """``hostname -> namespace -> EndpointShards``, updated one shard at a time."""

    def __init__(self) -> None:
        self._by_host: dict[str, dict[str, EndpointShards]] = {}

    def shards(self, hostname: str, namespace: str) -> EndpointShards | None:
        return self._by_host.get(hostname, {}).get(namespace)

    def update_service_endpoints(
        self, shard: ShardKey, hostname: str, namespace: str, endpoints: Iterable[Endpoint]
    ) -> PushType:
        """Replace one shard's endpoints of a service; say what push that needs.

        An empty list removes the shard but keeps the service's entry, so a
        later update is not mistaken for a new service.
        """
        new = tuple(endpoints)
        by_ns = self._by_host.setdefault(hostname, {})
        entry = by_ns.get(namespace)
        created = entry is None
        if entry is None:
            entry = by_ns[namespace] = EndpointShards()
        old = entry.shards.get(shard)
        if not new:
            if old is None and not created:
                return PushType.NO_PUSH
            entry.shards.pop(shard, None)
            accounts_changed = entry._recompute_service_accounts()
            return PushType.FULL if created or accounts_changed else PushType.INCREMENTAL
        if old == new and not created:
            return PushType.NO_PUSH
        entry.shards[shard] = new
        accounts_changed = entry._recompute_service_accounts()
        if created or accounts_changed:
            return PushType.FULL
        return PushType.INCREMENTAL

    def delete_service_shard(self, shard: ShardKey, hostname: str, namespace: str) -> None:
        """Forget a deleted service's endpoints from one shard."""
        by_ns = self._by_host.get(hostname)
        if by_ns is None or namespace not in by_ns:
            return
        entry = by_ns[namespace]
        entry.shards.pop(shard, None)
        entry._recompute_service_accounts()
        if not entry.shards:
            del by_ns[namespace]
            if not by_ns:
                del self._by_host[hostname]

    def delete_shard(self, shard: ShardKey) -> list[tuple[str, str]]:
        """Remove a whole shard (a remote cluster); returns the services it touched."""
        touched = []
        for hostname, by_ns in list(self._by_host.items()):
            for namespace in list(by_ns):
                if shard in by_ns[namespace].shards:
                    self.delete_service_shard(shard, hostname, namespace)
                    touched.append((hostname, namespace))
        return touched

    def services(self) -> Iterator[tuple[str, str, EndpointShards]]:
        for hostname in sorted(self._by_host):
            for namespace in sorted(self._by_host[hostname]):
                yield hostname, namespace, self._by_host[hostname][namespace]
