"""The EndpointIndex: every service's endpoints, sharded by where they came from (pure-Python twin).

Endpoints are kept out of the PushContext so that an endpoint change updates
this index in place and pushes EDS only, without rebuilding the snapshot.
An update costs in proportion to the shard it replaces. ``ext/endpoint_index.pyx``
is the compiled twin; both give the same results for every sequence of calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from meshpilot.model.endpoint import Endpoint
from meshpilot.model.endpoint_shards import EndpointShards, PushType, ShardKey


def _same(old: tuple[Endpoint, ...], new: tuple[Endpoint, ...]) -> bool:
    if len(old) != len(new):
        return False
    return all(a is b or a == b for a, b in zip(old, new, strict=True))


class EndpointIndex:
    """``hostname -> namespace -> EndpointShards``, updated one shard at a time."""

    def __init__(self) -> None:
        self._by_host: dict[str, dict[str, EndpointShards]] = {}
        #: Bumped on every change of any service's endpoints.
        self.generation = 0

    def shards(self, hostname: str, namespace: str) -> EndpointShards | None:
        by_ns = self._by_host.get(hostname)
        return by_ns.get(namespace) if by_ns is not None else None

    def update_service_endpoints(
        self, shard: ShardKey, hostname: str, namespace: str, endpoints: Iterable[Endpoint]
    ) -> PushType:
        """Replace one shard's endpoints of a service; say what push that needs.

        A new service, or a change of the service's identities (which cluster
        TLS settings name), needs a full push; other changes need EDS only. An
        empty list removes the shard but keeps the service's entry, so a later
        update is not mistaken for a new service.
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
            self.generation += 1
            changed = entry.remove_shard(shard)
            return PushType.FULL if created or changed else PushType.INCREMENTAL
        if not created and old is not None and _same(old, new):
            return PushType.NO_PUSH
        self.generation += 1
        accounts = frozenset(ep.service_account for ep in new if ep.service_account)
        changed = entry.set_shard(shard, new, accounts)
        return PushType.FULL if created or changed else PushType.INCREMENTAL

    def delete_service_shard(self, shard: ShardKey, hostname: str, namespace: str) -> None:
        """Forget a deleted service's endpoints from one shard."""
        by_ns = self._by_host.get(hostname)
        if by_ns is None or namespace not in by_ns:
            return
        entry = by_ns[namespace]
        self.generation += 1
        entry.remove_shard(shard)
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

    def __len__(self) -> int:
        """The number of (hostname, namespace) entries."""
        return sum(len(by_ns) for by_ns in self._by_host.values())
