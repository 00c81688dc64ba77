"""The environment a push reads: registries, config store, mesh config, endpoint index."""

from __future__ import annotations

import time
from collections.abc import Hashable, Mapping
from typing import Any

from meshpilot.config.store import ConfigStore
from meshpilot.model import labels as wk
from meshpilot.model.endpoint import Locality
from meshpilot.model.endpoint_index import EndpointIndex
from meshpilot.model.identity import same_objects
from meshpilot.model.jwks import JwksLookup
from meshpilot.model.proxy import Proxy, ProxyState, locality_label
from meshpilot.model.push_context import PushContext
from meshpilot.model.service import Service
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
        #: The latest snapshot's ``PushContext.carried`` entries, for the next to take over.
        self._carried: dict[Hashable, Any] = {}
        #: Where snapshots find fetched JWKS (set by the composition root; None: none fetched).
        self.jwks: JwksLookup | None = None
        #: The services of the last snapshot and the token that stands for them (PushContext.kept_token).
        self._services: list[Service] = []
        self._services_token = object()

    def build_push_context(self, version: str, *, keep_lasting: bool = True) -> PushContext:
        """A snapshot; ``keep_lasting=False`` starts it without outputs kept from earlier ones, and
        the next snapshot does not take over its carried outputs (a preview's)."""
        services = self.registry.services()
        if not same_objects(services, self._services):
            # Services are immutable: the same objects in the same order are the same services.
            self._services, self._services_token = services, object()
        accounts = {}
        for svc in services:
            shards = self.index.shards(svc.hostname, svc.namespace)
            if shards is not None and shards.service_accounts:
                accounts[(svc.hostname, svc.namespace)] = shards.service_accounts
        push = PushContext(
            version=version,
            mesh=self.mesh,
            services=services,
            configs=self.store.snapshot(),
            domain_suffix=self.domain_suffix,
            service_accounts=accounts,
            lasting=self._lasting if keep_lasting else {},
            share_outputs=self.share_outputs,
            jwks=self.jwks,
            # A snapshot that keeps nothing from earlier ones matches none of their tokens either.
            services_token=self._services_token if keep_lasting else None,
            carried_from=self._carried if keep_lasting else None,
        )
        if keep_lasting:
            self._carried = push.carried_on
        return push

    def refresh_proxy(self, proxy: Proxy, push: PushContext) -> None:
        """Recompute what a proxy's config depends on besides its identity (istiod's computeProxyState)."""
        before = proxy.state
        inputs = self.registry.workload_inputs(proxy)
        kept = before.workload_inputs
        if kept is not None and same_objects(kept, inputs):
            # Its Pod, Node and the services are the objects they were: so are the labels, locality
            # and service targets read from them (istiod reads the labels again only for a proxy
            # update; a Pod's change replaces it). Only the scope is the new snapshot's.
            proxy.state = ProxyState(
                labels=before.labels,
                locality=before.locality,
                service_targets=before.service_targets,
                sidecar_scope=push.sidecar_scope(proxy),
                previous_scope=before.sidecar_scope,
                workload_inputs=inputs,
            ).with_signature_of(before)
            return
        labels, where = self._workload(proxy)
        # The service targets and the Sidecar are chosen by the new labels: asked of the proxy with
        # them (neither reads the other). States are built whole, not by ``dataclasses.replace``,
        # which costs several times more.
        proxy.state = ProxyState(
            labels=labels,
            locality=where,
            service_targets=before.service_targets,
            sidecar_scope=before.sidecar_scope,
            previous_scope=before.previous_scope,
        )
        proxy.state = ProxyState(
            labels=labels,
            locality=where,
            service_targets=tuple(self.registry.service_targets(proxy)),
            sidecar_scope=push.sidecar_scope(proxy),
            previous_scope=before.sidecar_scope,
            workload_inputs=inputs,
            workload_reread=True,
        ).with_signature_of(before)

    def _workload(self, proxy: Proxy) -> tuple[Mapping[str, str], Locality]:
        """The proxy's labels, with the topology labels, and its locality, as the registry has them."""
        labels = self.registry.workload_labels(proxy)
        labels = labels if labels is not None else dict(proxy.metadata.labels)
        # As istiod's setTopologyLabels: the registry knows best (Pod label, Node), then the
        # proxy's own topology labels, then the locality Envoy reported in its node.
        locality = self.registry.proxy_locality(proxy) or _label_locality(labels) or proxy.node_locality
        # Topology labels are added so failoverPriority can compare them with endpoints'.
        labels = wk.with_topology(
            labels, locality=locality, cluster_id=proxy.cluster_id, network=proxy.metadata.network
        )
        return labels, Locality(locality, proxy.cluster_id)


def _label_locality(labels: dict[str, str]) -> str:
    keys = (wk.REGION, wk.ZONE, wk.SUBZONE)
    if not any(key in labels for key in keys):
        return ""
    return locality_label(*(labels.get(key, "") for key in keys))


def push_version(counter: int) -> str:
    """istiod's version format: RFC 3339 time, a slash, a counter."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + f"/{counter}"
