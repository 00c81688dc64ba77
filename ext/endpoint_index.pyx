# cython: language_level=3
"""The EndpointIndex (compiled twin).

Same contract as ``meshpilot.model.endpoint_index_py``, which documents it
and is the typed source of truth.
"""

from meshpilot.model.endpoint_shards import EndpointShards, PushType

cdef object NO_PUSH = PushType.NO_PUSH
cdef object INCREMENTAL = PushType.INCREMENTAL
cdef object FULL = PushType.FULL


cdef bint same(tuple old, tuple new) except -1:
    cdef Py_ssize_t i, n = len(old)
    if n != len(new):
        return False
    for i in range(n):
        a = old[i]
        b = new[i]
        if a is not b and a != b:
            return False
    return True


cdef frozenset accounts_of(tuple endpoints):
    cdef set out = set()
    cdef str account
    for ep in endpoints:
        account = ep.service_account
        if account:
            out.add(account)
    return frozenset(out)


cdef class EndpointIndex:
    """``hostname -> namespace -> EndpointShards``, updated one shard at a time."""

    cdef dict _by_host
    cdef public unsigned long long generation

    def __init__(self):
        self._by_host = {}
        self.generation = 0

    def shards(self, hostname, namespace):
        by_ns = self._by_host.get(hostname)
        return (<dict>by_ns).get(namespace) if by_ns is not None else None

    def update_service_endpoints(self, shard, hostname, namespace, endpoints):
        """Replace one shard's endpoints of a service; say what push that needs."""
        cdef tuple new = tuple(endpoints)
        cdef dict by_ns = self._by_host.get(hostname)
        cdef bint created, changed
        if by_ns is None:
            by_ns = {}
            self._by_host[hostname] = by_ns
        entry = by_ns.get(namespace)
        created = entry is None
        if created:
            entry = EndpointShards()
            by_ns[namespace] = entry
        old = entry.shards.get(shard)
        if not new:
            if old is None and not created:
                return NO_PUSH
            self.generation += 1
            changed = entry.remove_shard(shard)
            return FULL if created or changed else INCREMENTAL
        if not created and old is not None and same(<tuple>old, new):
            return NO_PUSH
        self.generation += 1
        changed = entry.set_shard(shard, new, accounts_of(new))
        return FULL if created or changed else INCREMENTAL

    def delete_service_shard(self, shard, hostname, namespace):
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

    def delete_shard(self, shard):
        """Remove a whole shard (a remote cluster); returns the services it touched."""
        touched = []
        for hostname, by_ns in list(self._by_host.items()):
            for namespace in list(by_ns):
                if shard in by_ns[namespace].shards:
                    self.delete_service_shard(shard, hostname, namespace)
                    touched.append((hostname, namespace))
        return touched

    def services(self):
        for hostname in sorted(self._by_host):
            by_ns = self._by_host[hostname]
            for namespace in sorted(by_ns):
                yield hostname, namespace, by_ns[namespace]

    def __len__(self):
        """The number of (hostname, namespace) entries."""
        return sum(len(by_ns) for by_ns in self._by_host.values())
