"""The environment a push reads: registries, config store, mesh config, endpoint index."""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import Any

from meshpilot.config.store import ConfigStore
from meshpilot.model.endpoint import Locality
from meshpilot.model.endpoint_index import EndpointIndex
from meshpilot.model.proxy import Proxy
from meshpilot.model.push_context import PushContext
from meshpilot.registry.aggregate import AggregateRegistry


class MeshEnvironment:
    """Builds PushContext snapshots and per-proxy state from the live sources."""

    def __init__(
        self,
        *,
        store: ConfigStore,
        registry: AggregateRegistry,
        index: EndpointIndex,
        mesh: Any,
        domain_suffix: str = "cluster.local",
        share_outputs: bool = True,
    ) -> None:
        self.store = store
        self.registry = registry
        self.index = index
        self.mesh = mesh
        self.domain_suffix = domain_suffix
        #: Whether proxies share generated outputs (off with the XdsCache: nothing shared at all).
        self.share_outputs = share_outputs
        #: PushContext.memoized_lasting's store, handed from snapshot to snapshot.
        self._lasting: dict[Hashable, Any] = {}

    def build_push_context(self, version: str, *, keep_lasting: bool = True) -> PushContext:
        """A snapshot; ``keep_lasting=False`` starts it without outputs kept from earlier ones."""
        services = self.registry.services()
        accounts = {}
        for svc in services:
            shards = self.index.shards(svc.hostname, svc.namespace)
            if shards is not None and shards.service_accounts:
                accounts[(svc.hostname, svc.namespace)] = shards.service_accounts
        return PushContext(
            version=version,
            mesh=self.mesh,
            services=services,
            configs=self.store.snapshot(),
            domain_suffix=self.domain_suffix,
            service_accounts=accounts,
            lasting=self._lasting if keep_lasting else {},
            share_outputs=self.share_outputs,
        )

    def refresh_proxy(self, proxy: Proxy, push: PushContext) -> None:
        """Recompute what a proxy's config depends on besides its identity (istiod's computeProxyState)."""
        labels = self.registry.workload_labels(proxy)
        proxy.labels = labels if labels is not None else dict(proxy.metadata.labels)
        locality = self.registry.proxy_locality(proxy)
        proxy.locality = Locality(locality, proxy.cluster_id)
        proxy.service_targets = tuple(self.registry.service_targets(proxy))
        proxy.previous_scope = proxy.sidecar_scope
        proxy.sidecar_scope = push.sidecar_scope(proxy)


def push_version(counter: int) -> str:
    """istiod's version format: RFC 3339 time, a slash, a counter."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + f"/{counter}"
