"""The ServiceEntry registry: services from ServiceEntries, endpoints from them and WorkloadEntries."""

from __future__ import annotations

import logging
from typing import Any

from meshpilot.config.store import ConfigEvent, ConfigStore
from meshpilot.model import labels as wk
from meshpilot.model.config import Config
from meshpilot.model.endpoint import Endpoint
from meshpilot.model.endpoint_index import ShardKey
from meshpilot.model.kind import Kind
from meshpilot.model.service import Service
from meshpilot.model.xds_updater import XdsUpdater
from meshpilot.registry.serviceentry.conversion import convert_services, inline_endpoints, workload_endpoints

log = logging.getLogger(__name__)

PROVIDER = "External"


class ServiceEntryRegistry:
    """Follows ServiceEntry and WorkloadEntry events of a ConfigStore."""

    def __init__(
        self,
        store: ConfigStore,
        updater: XdsUpdater,
        *,
        cluster_id: str = "Kubernetes",
        trust_domain: str = "cluster.local",
    ) -> None:
        self._store = store
        self._updater = updater
        self.cluster_id = cluster_id
        self.trust_domain = trust_domain
        self.shard = ShardKey(cluster_id, PROVIDER)
        #: (hostname, namespace) -> service; the oldest ServiceEntry defining the host wins.
        self._services: dict[tuple[str, str], Service] = {}
        store.add_handler(self._on_service_entry, Kind.SERVICE_ENTRY)
        store.add_handler(self._on_workload_entry, Kind.WORKLOAD_ENTRY)

    def services(self) -> list[Service]:
        return list(self._services.values())

    def _on_service_entry(self, event: ConfigEvent) -> None:
        keys: set[tuple[str, str]] = set()
        for config in (event.old, event.new):
            if config is not None:
                keys.update((host, config.namespace) for host in config.spec.hosts)
        self._refresh(keys)

    def _on_workload_entry(self, event: ConfigEvent) -> None:
        namespace = event.config.namespace
        keys: set[tuple[str, str]] = set()
        for se in self._store.configs(Kind.SERVICE_ENTRY, namespace):
            selector = se.spec.workload_selector.labels if se.spec.HasField("workload_selector") else None
            if selector is None:
                continue
            for we in (event.old, event.new):
                if we is not None and wk.selector_matches(selector, we.spec.labels):
                    keys.update((host, namespace) for host in se.spec.hosts)
        self._refresh(keys)

    def _refresh(self, keys: set[tuple[str, str]]) -> None:
        for hostname, namespace in sorted(keys):
            entries = [
                se for se in self._store.configs(Kind.SERVICE_ENTRY, namespace) if hostname in se.spec.hosts
            ]
            old = self._services.get((hostname, namespace))
            if not entries:
                if old is not None:
                    del self._services[(hostname, namespace)]
                    self._updater.service_update(self.shard, hostname, namespace, deleted=True)
                continue
            service = next(s for s in convert_services(entries[0]) if s.hostname == hostname)
            self._services[(hostname, namespace)] = service
            if old != service:
                self._updater.service_update(self.shard, hostname, namespace, deleted=False)
            endpoints: list[Endpoint] = []
            for se in entries:
                endpoints.extend(self._endpoints(se, service))
            self._updater.eds_update(self.shard, hostname, namespace, endpoints)

    def _endpoints(self, se: Config, service: Service) -> list[Endpoint]:
        out = inline_endpoints(se, service, cluster_id=self.cluster_id, trust_domain=self.trust_domain)
        spec: Any = se.spec
        if spec.HasField("workload_selector"):
            selector = dict(spec.workload_selector.labels)
            for we in self._store.configs(Kind.WORKLOAD_ENTRY, se.namespace):
                if wk.selector_matches(selector, we.spec.labels):
                    out.extend(
                        workload_endpoints(
                            we.spec,
                            namespace=we.namespace,
                            name=we.name,
                            service_ports=list(spec.ports),
                            cluster_id=self.cluster_id,
                            trust_domain=self.trust_domain,
                        )
                    )
        return out
