"""The aggregate registry: every registry's services seen as one, in priority order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from meshpilot.model.proxy import Proxy
from meshpilot.model.service import Service, ServiceTarget


class ServiceRegistry(Protocol):
    def services(self) -> list[Service]: ...


class WorkloadRegistry(ServiceRegistry, Protocol):
    """A registry that also knows the workloads behind proxies (the Kubernetes registry)."""

    cluster_id: str

    def workload_labels(self, proxy: Proxy) -> dict[str, str] | None: ...

    def proxy_locality(self, proxy: Proxy) -> str: ...

    def workload_inputs(self, proxy: Proxy) -> tuple[object, ...]:
        """The objects ``workload_labels``, ``proxy_locality`` and ``service_targets`` read for
        ``proxy``. Registry objects are replaced on a change, never edited: while these are the same
        objects, so are the answers."""
        ...

    def service_targets(self, proxy: Proxy) -> list[ServiceTarget]: ...


class AggregateRegistry:
    """Kubernetes registries first, then ServiceEntries: the first service for a host wins."""

    def __init__(self, workloads: Sequence[WorkloadRegistry], others: Sequence[ServiceRegistry]) -> None:
        self.workloads = list(workloads)
        self.others = list(others)

    def services(self) -> list[Service]:
        out: list[Service] = []
        for registry in [*self.workloads, *self.others]:
            out.extend(registry.services())
        return out

    def _of_cluster(self, proxy: Proxy) -> list[WorkloadRegistry]:
        """The registries that may hold the proxy's workload: those of its own cluster, as istiod
        looks a proxy up only in its cluster (pod IPs and names repeat across clusters). A proxy
        whose cluster no registry has is looked up everywhere, as before there were several."""
        own = [r for r in self.workloads if r.cluster_id == proxy.cluster_id]
        return own or self.workloads

    def workload_labels(self, proxy: Proxy) -> dict[str, str] | None:
        for registry in self._of_cluster(proxy):
            labels = registry.workload_labels(proxy)
            if labels is not None:
                return labels
        return None

    def proxy_locality(self, proxy: Proxy) -> str:
        for registry in self._of_cluster(proxy):
            locality = registry.proxy_locality(proxy)
            if locality:
                return locality
        return ""

    def workload_inputs(self, proxy: Proxy) -> tuple[object, ...]:
        """What ``workload_labels``, ``proxy_locality`` and ``service_targets`` read: the registries
        asked, each with its own inputs (the same objects, the same answers)."""
        out: list[object] = []
        for registry in self._of_cluster(proxy):
            out.append(registry)
            out.extend(registry.workload_inputs(proxy))
        return tuple(out)

    def service_targets(self, proxy: Proxy) -> list[ServiceTarget]:
        out: list[ServiceTarget] = []
        for registry in self._of_cluster(proxy):
            out.extend(registry.service_targets(proxy))
        return out
