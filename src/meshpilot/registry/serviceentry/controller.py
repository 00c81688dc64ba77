"""The ServiceEntry registry: services from ServiceEntries, endpoints from them, WorkloadEntries and Pods."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

from meshpilot.config.core_objects import KubePod
from meshpilot.config.store import ConfigEvent, ConfigStore, config_order
from meshpilot.model import labels as wk
from meshpilot.model.config import Config, ConfigKey
from meshpilot.model.endpoint import Endpoint
from meshpilot.model.endpoint_index import ShardKey
from meshpilot.model.kind import Kind
from meshpilot.model.push_context import workload_selector
from meshpilot.model.push_request import PushRequest, TriggerReason
from meshpilot.model.service import Service
from meshpilot.model.xds_updater import XdsUpdater
from meshpilot.registry.serviceentry.conversion import (
    convert_services,
    dns_only_address,
    inline_endpoints,
    pod_endpoints,
    pod_selectable,
    selects_dns_only,
    workload_endpoints,
    workload_entry_labels,
)

log = logging.getLogger(__name__)

PROVIDER = "External"

#: Called with a Pod's old and new version (None when added or removed).
PodHandler = Callable[[KubePod | None, KubePod | None], None]


class PodSource(Protocol):
    """Pods a ServiceEntry's workloadSelector may pick (the Kubernetes registry)."""

    def pods_in(self, namespace: str) -> list[KubePod]: ...

    def pod_workload_locality(self, pod: KubePod) -> str: ...

    def add_pod_handler(self, handler: PodHandler) -> None: ...


def _endpoints_in_config(service: Service) -> bool:
    return selects_dns_only(service) or service.is_headless


class ServiceEntryRegistry:
    """Follows ServiceEntry and WorkloadEntry events of a ConfigStore, and Pod events of ``pods``."""

    def __init__(
        self,
        store: ConfigStore,
        updater: XdsUpdater,
        *,
        cluster_id: str = "Kubernetes",
        trust_domain: str = "cluster.local",
        pods: PodSource | None = None,
    ) -> None:
        self._store = store
        self._updater = updater
        self._pods = pods
        self.cluster_id = cluster_id
        self.trust_domain = trust_domain
        self.shard = ShardKey(cluster_id, PROVIDER)
        #: (hostname, namespace) -> service; the oldest ServiceEntry defining the host wins.
        self._services: dict[tuple[str, str], Service] = {}
        #: Last endpoints reported per (hostname, namespace), to tell when they changed.
        self._endpoints_sent: dict[tuple[str, str], list[Endpoint]] = {}
        #: The ServiceEntries defining each (hostname, namespace), by name. Kept here so that an
        #: event looks up its hosts' entries instead of sorting the namespace's ServiceEntries:
        #: that sort per event made a file of 10,000 ServiceEntries cost minutes (quadratic).
        self._defining: dict[tuple[str, str], dict[str, Config]] = {}
        #: The ServiceEntries with a workloadSelector, by namespace and name: only these are asked
        #: about WorkloadEntries and Pods, and other namespaces' Pods concern no one here.
        self._selecting_entries: dict[str, dict[str, Config]] = {}
        #: WorkloadEntries by namespace and name: a selector's endpoints are found among its
        #: namespace's entries without sorting every entry of the store.
        self._workload_entries: dict[str, dict[str, Config]] = {}
        #: Hosts whose endpoints WorkloadEntry or Pod events changed during a store batch: refreshed
        #: once at its end, not once per workload (a file of 5,000 entries was quadratic in the count).
        self._pending: set[tuple[str, str]] = set()
        for se in store.configs(Kind.SERVICE_ENTRY):
            self._index(se)
        for we in store.configs(Kind.WORKLOAD_ENTRY):
            self._workload_entries.setdefault(we.namespace, {})[we.name] = we
        store.add_handler(self._on_service_entry, Kind.SERVICE_ENTRY)
        store.add_handler(self._on_workload_entry, Kind.WORKLOAD_ENTRY)
        store.add_batch_end_handler(self._end_batch)
        if pods is not None:
            pods.add_pod_handler(self._on_pod)

    def services(self) -> list[Service]:
        return list(self._services.values())

    def _on_service_entry(self, event: ConfigEvent) -> None:
        keys: set[tuple[str, str]] = set()
        if event.old is not None:
            self._unindex(event.old)
            keys.update((host, event.old.namespace) for host in event.old.spec.hosts)
        if event.new is not None:
            self._index(event.new)
            keys.update((host, event.new.namespace) for host in event.new.spec.hosts)
        self._refresh(keys)

    def _index(self, se: Config) -> None:
        for host in se.spec.hosts:
            self._defining.setdefault((host, se.namespace), {})[se.name] = se
        if workload_selector(se) is not None:
            self._selecting_entries.setdefault(se.namespace, {})[se.name] = se

    def _unindex(self, se: Config) -> None:
        for host in se.spec.hosts:
            defining = self._defining.get((host, se.namespace))
            if defining is not None:
                defining.pop(se.name, None)
                if not defining:
                    del self._defining[(host, se.namespace)]
        selecting = self._selecting_entries.get(se.namespace)
        if selecting is not None:
            selecting.pop(se.name, None)
            if not selecting:
                del self._selecting_entries[se.namespace]

    def _on_workload_entry(self, event: ConfigEvent) -> None:
        namespace = event.config.namespace
        if event.new is not None:
            self._workload_entries.setdefault(namespace, {})[event.new.name] = event.new
        else:
            entries = self._workload_entries.get(namespace, {})
            entries.pop(event.config.name, None)
            if not entries:
                self._workload_entries.pop(namespace, None)
        labels = [workload_entry_labels(we) for we in (event.old, event.new) if we is not None]
        self._refresh_workloads(self._selecting(namespace, labels))

    def _refresh_workloads(self, keys: set[tuple[str, str]]) -> None:
        """Refresh hosts whose selected workloads changed: now, or at the end of the store's batch."""
        if self._store.in_batch:
            self._pending |= keys
        else:
            self._refresh(keys)

    def _end_batch(self) -> None:
        if self._pending:
            # Forgotten only once refreshed: if the refresh fails, the next batch's end tries again.
            self._refresh(self._pending)
            self._pending = set()

    def _on_pod(self, old: KubePod | None, new: KubePod | None) -> None:
        pods = [p for p in (old, new) if p is not None]
        if pods and pods[0].meta.namespace in self._selecting_entries:
            self._refresh_workloads(self._selecting(pods[0].meta.namespace, [p.meta.labels for p in pods]))

    def _selecting(self, namespace: str, label_sets: list[dict[str, str]]) -> set[tuple[str, str]]:
        """Hosts of the ServiceEntries in ``namespace`` whose workloadSelector matches any label set."""
        keys: set[tuple[str, str]] = set()
        for se in self._selecting_entries.get(namespace, {}).values():
            selector = workload_selector(se)
            if selector is not None and any(wk.selector_matches(selector, labels) for labels in label_sets):
                keys.update((host, namespace) for host in se.spec.hosts)
        return keys

    def _refresh(self, keys: set[tuple[str, str]]) -> None:
        for hostname, namespace in sorted(keys):
            entries = sorted(self._defining.get((hostname, namespace), {}).values(), key=config_order)
            old = self._services.get((hostname, namespace))
            if not entries:
                self._endpoints_sent.pop((hostname, namespace), None)
                if old is not None:
                    del self._services[(hostname, namespace)]
                    self._updater.service_update(self.shard, hostname, namespace, deleted=True)
                continue
            service = next(s for s in convert_services(entries[0]) if s.hostname == hostname)
            if old == service:
                # The same object while nothing changed: snapshots compare services by identity
                # (shared outputs, kept listener keys), and a workload event converts them anew.
                service = old
            else:
                self._services[(hostname, namespace)] = service
                self._updater.service_update(self.shard, hostname, namespace, deleted=False)
            endpoints: list[Endpoint] = []
            for se in entries:
                endpoints.extend(self._endpoints(se, service))
            before = self._endpoints_sent.get((hostname, namespace))
            self._endpoints_sent[(hostname, namespace)] = endpoints
            self._updater.eds_update(self.shard, hostname, namespace, endpoints)
            if (
                old == service
                and before is not None
                and before != endpoints
                and _endpoints_in_config(service)
            ):
                # EDS cannot carry these endpoints: they are in the cluster (DNS) or make
                # listeners (resolution NONE), so only a full push delivers them (istiod
                # pushes a config update for DNS ServiceEntries whose endpoints change).
                self._updater.config_update(
                    PushRequest(
                        full=True,
                        configs_updated=frozenset({ConfigKey(Kind.SERVICE_ENTRY, hostname, namespace)}),
                        reasons=Counter({TriggerReason.ENDPOINT: 1}),
                    )
                )

    def _endpoints(self, se: Config, service: Service) -> list[Endpoint]:
        """Inline endpoints, or those of the WorkloadEntries and Pods the selector picks.

        As in istiod, a selector replaces inline endpoints, and workloads addressed
        by name or unix socket back only DNS ServiceEntries.
        """
        selector = workload_selector(se)
        if selector is None:
            return inline_endpoints(se, service, cluster_id=self.cluster_id, trust_domain=self.trust_domain)
        spec: Any = se.spec
        ports = list(spec.ports)
        dns = selects_dns_only(service)
        out: list[Endpoint] = []
        # Pods before WorkloadEntries, each by name: istiod's order of selected workloads.
        if self._pods is not None:
            selected = (
                pod
                for pod in self._pods.pods_in(se.namespace)
                if pod_selectable(pod) and wk.selector_matches(selector, pod.meta.labels)
            )
            # Only the selected pods are sorted: a namespace may hold thousands of others.
            for pod in sorted(selected, key=lambda p: p.meta.name):
                out.extend(
                    pod_endpoints(
                        pod,
                        locality=self._pods.pod_workload_locality(pod),
                        service_ports=ports,
                        cluster_id=self.cluster_id,
                        trust_domain=self.trust_domain,
                    )
                )
        entries = self._workload_entries.get(se.namespace, {})
        for name in sorted(entries):
            we = entries[name]
            labels = workload_entry_labels(we)
            if not wk.selector_matches(selector, labels):
                continue
            if dns_only_address(we.spec.address) and not dns:
                continue
            out.extend(
                workload_endpoints(
                    we.spec,
                    namespace=we.namespace,
                    name=we.name,
                    service_ports=ports,
                    cluster_id=self.cluster_id,
                    trust_domain=self.trust_domain,
                    labels=labels,
                )
            )
        return out
