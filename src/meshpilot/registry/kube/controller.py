"""The Kubernetes registry: keeps core objects and turns them into services and endpoints.

It is an ObjectSink, so the config directory and (later) the Kubernetes API
feed it the same way. Every change is reported to the XdsUpdater: service
changes as service updates, endpoint changes as EDS updates of the whole
service (the union of its EndpointSlices), so the EndpointIndex decides
whether a push is needed.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from meshpilot.config.core_objects import (
    KubeEndpointSlice,
    KubeNamespace,
    KubeNode,
    KubeObject,
    KubePod,
    KubeService,
)
from meshpilot.model import labels as wk
from meshpilot.model.config import ConfigKey
from meshpilot.model.endpoint import Endpoint
from meshpilot.model.endpoint_index import ShardKey
from meshpilot.model.kind import Kind
from meshpilot.model.proxy import Proxy
from meshpilot.model.push_request import PushRequest, TriggerReason
from meshpilot.model.service import Service, ServiceTarget
from meshpilot.model.xds_updater import XdsUpdater
from meshpilot.registry.kube.conversion import (
    convert_service,
    pod_locality,
    service_hostname,
    slice_endpoints,
)

log = logging.getLogger(__name__)

PROVIDER = "Kubernetes"


class _ServicesToken:
    """Stands for the registry's services as they are: replaced, never edited, on every change."""

    __slots__ = ()


class KubeRegistry:
    """Services and endpoints of one Kubernetes cluster."""

    def __init__(
        self,
        updater: XdsUpdater,
        *,
        cluster_id: str = "Kubernetes",
        domain_suffix: str = "cluster.local",
        trust_domain: str = "cluster.local",
    ) -> None:
        self._updater = updater
        self.cluster_id = cluster_id
        self.domain_suffix = domain_suffix
        self.trust_domain = trust_domain
        self.shard = ShardKey(cluster_id, PROVIDER)
        self._namespaces: dict[str, KubeNamespace] = {}
        self._nodes: dict[str, KubeNode] = {}
        self._kube_services: dict[tuple[str, str], KubeService] = {}
        self._kube_services_by_ns: dict[str, dict[str, KubeService]] = defaultdict(dict)
        self._services: dict[str, Service] = {}  # by hostname
        self._slices: dict[tuple[str, str], KubeEndpointSlice] = {}
        self._slices_by_service: dict[tuple[str, str], set[str]] = defaultdict(set)
        self._pods: dict[tuple[str, str], KubePod] = {}
        self._pods_by_ip: dict[str, KubePod] = {}
        # What each service's endpoints were computed from, and the reverse:
        # which services to recompute when a pod, an IP or a node changes.
        self._inputs: dict[tuple[str, str], _Inputs] = {}
        self._by_pod: dict[tuple[str, str], set[tuple[str, str]]] = defaultdict(set)
        self._by_ip: dict[str, set[tuple[str, str]]] = defaultdict(set)
        self._by_node: dict[str, set[tuple[str, str]]] = defaultdict(set)
        # service_targets per Pod, valid while the Pod object and the services are the same (few
        # pushes change either). The services' token is replaced on every change of a Service:
        # a proxy's workload inputs hold it, so a refresh keeps its targets while it stands.
        self._services_token = _ServicesToken()
        # Inside batch(): services whose endpoints are recomputed when the batch ends.
        self._batch_depth = 0
        self._pending: set[tuple[str, str]] = set()
        self._targets: dict[tuple[str, str], tuple[KubePod, _ServicesToken, list[ServiceTarget]]] = {}
        self._pods_by_ns: dict[str, dict[str, KubePod]] = defaultdict(dict)
        #: Endpoint addresses of headless services last reported, to tell when listeners change.
        self._headless_addresses: dict[tuple[str, str], frozenset[str]] = {}
        #: Told of every Pod change (ServiceEntries select Pods too, istiod's workload handlers).
        self._pod_handlers: list[Callable[[KubePod | None, KubePod | None], None]] = []

    # -- ObjectSink ------------------------------------------------------------

    def upsert(self, obj: KubeObject) -> None:
        if isinstance(obj, KubeService):
            self._upsert_service(obj)
        elif isinstance(obj, KubeEndpointSlice):
            self._upsert_slice(obj)
        elif isinstance(obj, KubePod):
            self._upsert_pod(obj)
        elif isinstance(obj, KubeNode):
            self._nodes[obj.meta.name] = obj
            self._refresh_services(set(self._by_node.get(obj.meta.name, ())))
        elif isinstance(obj, KubeNamespace):
            self._namespaces[obj.meta.name] = obj

    def remove(self, kind: Kind, namespace: str, name: str) -> None:
        if kind is Kind.SERVICE:
            self._remove_service(namespace, name)
        elif kind is Kind.ENDPOINT_SLICE:
            old = self._slices.pop((namespace, name), None)
            if old is not None:
                self._slices_by_service[(namespace, old.service_name)].discard(name)
                self._refresh_services({(namespace, old.service_name)})
        elif kind is Kind.POD:
            self._targets.pop((namespace, name), None)
            pod = self._pods.pop((namespace, name), None)
            self._pods_by_ns[namespace].pop(name, None)
            if pod is not None:
                self._notify_pod(pod, None)
                for ip in pod.pod_ips:
                    if self._pods_by_ip.get(ip) is pod:
                        del self._pods_by_ip[ip]
                self._refresh_services(self._services_of_pod(pod))
        elif kind is Kind.NODE:
            if self._nodes.pop(name, None) is not None:
                self._refresh_services(set(self._by_node.get(name, ())))
        elif kind is Kind.NAMESPACE:
            self._namespaces.pop(name, None)

    # -- Pods for other registries ----------------------------------------------------

    def add_pod_handler(self, handler: Callable[[KubePod | None, KubePod | None], None]) -> None:
        self._pod_handlers.append(handler)

    def pods_in(self, namespace: str) -> list[KubePod]:
        return list(self._pods_by_ns.get(namespace, {}).values())

    def pod_workload_locality(self, pod: KubePod) -> str:
        return pod_locality(pod, self._nodes.get(pod.node_name))

    def _notify_pod(self, old: KubePod | None, new: KubePod | None) -> None:
        if old is not None and new is not None and old == new:
            return
        for handler in self._pod_handlers:
            handler(old, new)

    # -- queries -------------------------------------------------------------------

    def services(self) -> list[Service]:
        return list(self._services.values())

    def get_service(self, hostname: str) -> Service | None:
        return self._services.get(hostname)

    def namespaces(self) -> list[KubeNamespace]:
        return list(self._namespaces.values())

    def pod_for_proxy(self, proxy: Proxy) -> KubePod | None:
        """The proxy's Pod: by the ``name.namespace`` in its ID, then by its IP."""
        key = proxy.pod_key
        if key is not None:
            pod = self._pods.get(key)
            if pod is not None:
                return pod
        return self._pods_by_ip.get(proxy.ip)

    def workload_labels(self, proxy: Proxy) -> dict[str, str] | None:
        pod = self.pod_for_proxy(proxy)
        return dict(pod.meta.labels) if pod is not None else None

    def proxy_locality(self, proxy: Proxy) -> str:
        pod = self.pod_for_proxy(proxy)
        if pod is None:
            return ""
        return pod_locality(pod, self._nodes.get(pod.node_name))

    def workload_inputs(self, proxy: Proxy) -> tuple[object, ...]:
        """The proxy's Pod, the Pod's Node and the services' token: the labels and the locality are
        read from nothing else, the service targets from the Pod and the services. No Pod, no targets."""
        pod = self.pod_for_proxy(proxy)
        if pod is None:
            return ()
        return (pod, self._nodes.get(pod.node_name), self._services_token)

    def service_targets(self, proxy: Proxy) -> list[ServiceTarget]:
        """Ports of the services whose selector picks the proxy's Pod."""
        pod = self.pod_for_proxy(proxy)
        if pod is None:
            return []
        key = (pod.meta.namespace, pod.meta.name)
        cached = self._targets.get(key)
        if cached is not None and cached[0] is pod and cached[1] is self._services_token:
            return list(cached[2])
        targets = self._compute_targets(pod)
        self._targets[key] = (pod, self._services_token, targets)
        return list(targets)

    def _compute_targets(self, pod: KubePod) -> list[ServiceTarget]:
        targets = []
        in_namespace = self._kube_services_by_ns.get(pod.meta.namespace, {})
        for name in sorted(in_namespace):
            svc = self._services.get(self._hostname(pod.meta.namespace, name))
            if svc is None or not svc.selector:
                continue
            if not wk.selector_matches(svc.selector, pod.meta.labels):
                continue
            for port in svc.ports:
                target = _resolve_target_port(port.target_port, port.port, pod)
                if target:
                    targets.append(ServiceTarget(svc, port, target))
        return targets

    # -- internals -----------------------------------------------------------------

    def _hostname(self, namespace: str, name: str) -> str:
        return service_hostname(name, namespace, self.domain_suffix)

    def _upsert_service(self, ks: KubeService) -> None:
        key = (ks.meta.namespace, ks.meta.name)
        self._kube_services[key] = ks
        self._kube_services_by_ns[ks.meta.namespace][ks.meta.name] = ks
        svc = convert_service(
            ks, domain_suffix=self.domain_suffix, cluster_id=self.cluster_id, trust_domain=self.trust_domain
        )
        old = self._services.get(svc.hostname)
        if old != svc:
            # An equal one keeps the old object: snapshots compare services by identity (shared
            # outputs, kept listener keys), and a resync converts every Service anew. Nor does it
            # change any Pod's targets, which read only these objects and their names.
            self._services_token = _ServicesToken()
            self._services[svc.hostname] = svc
            self._updater.service_update(self.shard, svc.hostname, svc.namespace, deleted=False)
        if old is None:
            # Endpoints may have arrived first; report them now that the service exists.
            self._refresh_services({key})

    def _remove_service(self, namespace: str, name: str) -> None:
        if self._kube_services.pop((namespace, name), None) is None:
            return
        self._services_token = _ServicesToken()
        self._kube_services_by_ns[namespace].pop(name, None)
        hostname = self._hostname(namespace, name)
        self._services.pop(hostname, None)
        self._updater.service_update(self.shard, hostname, namespace, deleted=True)

    def _upsert_slice(self, es: KubeEndpointSlice) -> None:
        key = (es.meta.namespace, es.meta.name)
        old = self._slices.get(key)
        self._slices[key] = es
        touched = {(es.meta.namespace, es.service_name)}
        if old is not None and old.service_name != es.service_name:
            self._slices_by_service[(es.meta.namespace, old.service_name)].discard(es.meta.name)
            touched.add((es.meta.namespace, old.service_name))
        if es.service_name:
            self._slices_by_service[(es.meta.namespace, es.service_name)].add(es.meta.name)
        self._refresh_services(touched)

    def _upsert_pod(self, pod: KubePod) -> None:
        key = (pod.meta.namespace, pod.meta.name)
        old = self._pods.get(key)
        self._pods[key] = pod
        self._pods_by_ns[pod.meta.namespace][pod.meta.name] = pod
        if old is not None:
            for ip in old.pod_ips:
                if self._pods_by_ip.get(ip) is old:
                    del self._pods_by_ip[ip]
        if not pod.host_network:
            for ip in pod.pod_ips:
                self._pods_by_ip[ip] = pod
        self._refresh_services(self._services_of_pod(pod) | (self._services_of_pod(old) if old else set()))
        self._notify_pod(old, pod)
        if old is not None and old.meta.labels != pod.meta.labels:
            for ip in pod.pod_ips:
                self._updater.proxy_update(self.cluster_id, ip)

    def _services_of_pod(self, pod: KubePod) -> set[tuple[str, str]]:
        """Services whose endpoints name this pod, or its IPs without naming a pod."""
        found = set(self._by_pod.get((pod.meta.namespace, pod.meta.name), ()))
        for ip in pod.pod_ips:
            found |= self._by_ip.get(ip, set())
        return found

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Apply many objects, computing each touched service's endpoints once at the end.

        Without it, loading a file of a thousand pods after their EndpointSlice
        recomputes the whole service once per pod.
        """
        self._batch_depth += 1
        try:
            yield
        finally:
            self._batch_depth -= 1
            if self._batch_depth == 0 and self._pending:
                pending, self._pending = self._pending, set()
                self._refresh_services(pending)

    def _refresh_services(self, keys: set[tuple[str, str]]) -> None:
        if self._batch_depth:
            self._pending |= keys
            return
        # Only services the cluster has: a slice whose Service is deleted (or not created yet)
        # reports nothing, whether it changes alone or in a batch, so the endpoints are a function
        # of the objects, not of the order they came in (a push worker loads them in one batch).
        # A Service that comes reports its slices' endpoints (_upsert_service).
        for namespace, name in sorted(keys):
            if name and (namespace, name) in self._kube_services:
                self._refresh_endpoints(namespace, name)

    def _refresh_endpoints(self, namespace: str, name: str) -> None:
        """Recompute a service's endpoints from all its slices and report them."""
        key = (namespace, name)
        endpoints: list[Endpoint] = []
        inputs = _Inputs()
        for slice_name in sorted(self._slices_by_service.get(key, ())):
            es = self._slices[(namespace, slice_name)]
            found, pending = slice_endpoints(
                es,
                pods_by_name=self._pods,
                pods_by_ip=self._pods_by_ip,
                nodes=self._nodes,
                cluster_id=self.cluster_id,
                trust_domain=self.trust_domain,
            )
            endpoints.extend(found)
            for pod_key in pending:
                log.debug("endpoint of %s/%s waits for pod %s/%s", namespace, name, *pod_key)
            for e in es.endpoints:
                if e.target_ref is not None and e.target_ref[0] == "Pod":
                    inputs.pods.add((e.target_ref[1], e.target_ref[2]))
                else:
                    inputs.ips.add(e.addresses[0])
            inputs.nodes.update(ep.node_name for ep in found if ep.node_name)
        self._index_inputs(key, inputs)
        hostname = self._hostname(namespace, name)
        self._updater.eds_update(self.shard, hostname, namespace, endpoints)
        self._push_headless(key, hostname, endpoints)

    def _push_headless(self, key: tuple[str, str], hostname: str, endpoints: list[Endpoint]) -> None:
        """A headless service with a non-HTTP port has a listener per endpoint address, so a
        change of its addresses needs a full push, not EDS alone (istiod's HeadlessEndpointUpdate)."""
        svc = self._services.get(hostname)
        if svc is None or not svc.is_headless or all(p.protocol.is_http for p in svc.ports):
            self._headless_addresses.pop(key, None)
            return
        addresses = frozenset(ep.address for ep in endpoints)
        before = self._headless_addresses.get(key)
        self._headless_addresses[key] = addresses
        if before is not None and before != addresses:
            self._updater.config_update(
                PushRequest(
                    full=True,
                    configs_updated=frozenset({ConfigKey(Kind.SERVICE_ENTRY, hostname, key[0])}),
                    reasons=Counter({TriggerReason.HEADLESS_ENDPOINT: 1}),
                )
            )

    def _index_inputs(self, key: tuple[str, str], inputs: _Inputs) -> None:
        old = self._inputs.pop(key, None) or _Inputs()
        for index, before, after in (
            (self._by_pod, old.pods, inputs.pods),
            (self._by_ip, old.ips, inputs.ips),
            (self._by_node, old.nodes, inputs.nodes),
        ):
            for gone in before - after:
                services = index[gone]  # type: ignore[index]
                services.discard(key)
                if not services:
                    del index[gone]  # type: ignore[arg-type]
            for new in after - before:
                index[new].add(key)  # type: ignore[index]
        if inputs.pods or inputs.ips or inputs.nodes:
            self._inputs[key] = inputs


@dataclass(slots=True)
class _Inputs:
    pods: set[tuple[str, str]] = field(default_factory=set)
    ips: set[str] = field(default_factory=set)
    nodes: set[str] = field(default_factory=set)


def _resolve_target_port(target: int | str, port: int, pod: KubePod) -> int:
    if isinstance(target, int):
        return target or port
    for cp in pod.container_ports:
        if cp.name == target:
            return cp.container_port
    return 0
