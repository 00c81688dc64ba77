"""ClusterLoadAssignments: a cluster's endpoints, grouped by locality (EDS)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from envoy.config.core.v3 import address_pb2, base_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from google.protobuf import struct_pb2

from meshpilot.model.config import ConfigKey
from meshpilot.model.confighash import hash_value
from meshpilot.model.destination_rules import MergedDestinationRule
from meshpilot.model.endpoint import TLS_MODE_ISTIO, Endpoint, HealthStatus
from meshpilot.model.endpoint_index import EndpointIndex
from meshpilot.model.kind import Kind
from meshpilot.model.peer_authentication import MtlsMode, PeerAuthenticationIndex
from meshpilot.model.service import PREFER_CLOSE, Service
from meshpilot.networking import locality_lb, names, wire, wire_py
from meshpilot.networking import traffic_policy as tp
from meshpilot.networking.locality_lb import LocalityGroup
from meshpilot.networking.protobuf import uint32

#: DestinationRule ClientTLSSettings.TLSmode numbers.
TLS_DISABLE, TLS_SIMPLE, TLS_MUTUAL, TLS_ISTIO_MUTUAL = 0, 1, 2, 3


def _port_tls_mode(policy: Any | None, port: int) -> int | None:
    """A policy's TLS mode for ``port``: its port-level setting's, else its own (istiod's
    trafficPolicyTLSModeForPort)."""
    if policy is None:
        return None
    mode = policy.tls.mode if policy.HasField("tls") else None
    for settings in policy.port_level_settings:
        if settings.port.number == port and settings.HasField("tls"):
            return int(settings.tls.mode)
    return None if mode is None else int(mode)


@dataclass(frozen=True, slots=True)
class EndpointTls:
    """Which endpoints of a port EDS marks ``tlsMode: istio`` (the auto-mTLS transport socket match).

    As istiod's mtlsChecker: the rule's mode for the port, or the mode of the
    first subset whose labels the endpoint carries, whatever subset the cluster
    is for. DISABLE marks no endpoint, ISTIO_MUTUAL every one, otherwise the
    endpoint's own ``security.istio.io/tlsMode`` label decides.
    """

    root: int | None = None
    #: Every subset's labels and port mode, in order; empty when no subset sets a mode.
    subsets: tuple[tuple[tuple[tuple[str, str], ...], int | None], ...] = ()
    #: The snapshot's PeerAuthentications when some policy sets DISABLE (an endpoint whose
    #: workload's port is DISABLE gets no mark, as istiod's mtlsChecker); None otherwise.
    peer: PeerAuthenticationIndex | None = field(default=None, compare=False)
    #: The policies' fingerprint when ``peer`` is set: the cache key part that stands for it.
    peer_key: int | None = None

    @property
    def wire_mode(self) -> int:
        """The one mode for all endpoints, as the wire encoder takes it (only without subset modes)."""
        return _wire_mode(self.root)

    def mtls(self, ep: Endpoint) -> bool:
        mode = self.root
        for labels, subset_mode in self.subsets:
            if all(ep.labels.get(key) == value for key, value in labels):
                if subset_mode is not None:
                    mode = subset_mode
                break
        wire_mode = _wire_mode(mode)
        if wire_mode != wire.NO_TLS_MODE:
            return wire_mode == TLS_ISTIO_MUTUAL
        if ep.tls_mode != TLS_MODE_ISTIO:
            return False
        if self.peer is None:
            return True
        # The endpoint's own workload and port, as the server's listener resolves them.
        return self.peer.for_workload(ep.namespace, ep.labels).for_port(ep.port) is not MtlsMode.DISABLE

    def with_peer(self, peer: PeerAuthenticationIndex) -> EndpointTls:
        """This, also reading the endpoints' PeerAuthentication if any policy can DISABLE mTLS."""
        if not peer.any_disable:
            return self
        return EndpointTls(self.root, self.subsets, peer, peer.fingerprint)


def _wire_mode(mode: int | None) -> int:
    # SIMPLE and MUTUAL leave the decision to the endpoint's label, as no mode does.
    return wire.NO_TLS_MODE if mode is None or mode in (TLS_SIMPLE, TLS_MUTUAL) else mode


_NO_RULE_TLS = EndpointTls()


def endpoint_tls(rule: MergedDestinationRule | None, port: int) -> EndpointTls:
    """The EndpointTls of a rule's host and port (istiod's newMtlsChecker)."""
    if rule is None:
        return EndpointTls()
    root = _port_tls_mode(rule.traffic_policy, port)
    subsets = tuple(
        (
            tuple(sorted(subset.labels.items())),
            _port_tls_mode(subset.traffic_policy if subset.HasField("traffic_policy") else None, port),
        )
        for subset in rule.subsets
    )
    if all(mode is None for _, mode in subsets):
        subsets = ()
    return EndpointTls(root, subsets)


def socket_address(address: str, port: int) -> Any:
    if address.startswith("unix://"):
        return address_pb2.Address(pipe=address_pb2.Pipe(path=address[len("unix://") :]))
    return address_pb2.Address(socket_address=address_pb2.SocketAddress(address=address, port_value=port))


def lb_endpoint(ep: Endpoint, *, mtls: bool) -> Any:
    """One endpoint with istiod's metadata: the tlsMode match and the workload for telemetry."""
    metadata = base_pb2.Metadata()
    if mtls:
        metadata.filter_metadata["envoy.transport_socket_match"].update({"tlsMode": TLS_MODE_ISTIO})
    metadata.filter_metadata["istio"].update({"workload": ep.telemetry})
    endpoint = endpoint_components_pb2.Endpoint(address=socket_address(ep.address, ep.port))
    for extra in ep.extra_addresses:
        endpoint.additional_addresses.add(address=socket_address(extra, ep.port))
    return endpoint_components_pb2.LbEndpoint(
        endpoint=endpoint,
        health_status=int(ep.health)
        if ep.health is not HealthStatus.TERMINATING
        else int(HealthStatus.UNHEALTHY),
        load_balancing_weight=uint32(ep.weight or 1),
        metadata=metadata,
    )


def _locality(label: str) -> Any:
    parts = label.split("/") if label else []
    parts += [""] * (3 - len(parts))
    return base_pb2.Locality(region=parts[0], zone=parts[1], sub_zone=parts[2])


def select_endpoints(
    index: EndpointIndex,
    svc: Service,
    port_name: str,
    subset_labels: Mapping[str, str] | None,
    *,
    allow_hostnames: bool = False,
) -> list[Endpoint]:
    """The healthy endpoints of one service port (and subset), shards in sorted order."""
    shards = index.shards(svc.hostname, svc.namespace)
    if shards is None:
        return []
    return wire.select([ep for _, ep in shards.endpoints()], port_name, subset_labels, allow_hostnames)


def _mtls(ep: Endpoint, tls_mode: int | None) -> bool:
    return tls_mode == TLS_ISTIO_MUTUAL if tls_mode is not None else ep.tls_mode == TLS_MODE_ISTIO


def locality_groups(endpoints: Iterable[Endpoint], *, tls_mode: int | None) -> list[Any]:
    """LocalityLbEndpoints, one per locality in sorted order, weighted by their endpoints.

    ``tls_mode`` as the wire encoder takes it: ISTIO_MUTUAL marks every endpoint,
    another mode none, None leaves it to each endpoint's label.
    """
    groups = locality_lb.groups_by_locality(list(endpoints))
    return render_groups(groups, lambda ep: _mtls(ep, tls_mode))


def render_groups(groups: Iterable[LocalityGroup], mtls: Callable[[Endpoint], bool]) -> list[Any]:
    """LocalityLbEndpoints of already grouped (maybe reweighted and prioritized) endpoints."""
    return [
        endpoint_components_pb2.LocalityLbEndpoints(
            locality=_locality(group.label),
            lb_endpoints=[lb_endpoint(ep, mtls=mtls(ep)) for ep in group.endpoints],
            # Weight 0 only on a locality left without endpoints (mtls_groups): istiod sends none.
            load_balancing_weight=uint32(group.weight) if group.weight else None,
            priority=group.priority,
        )
        for group in groups
    ]


def _encode_groups(groups: Iterable[LocalityGroup], mtls: Callable[[Endpoint], bool]) -> Iterator[bytes]:
    """Encoded LocalityLbEndpoints of per-proxy locality assignments and per-subset TLS modes;
    the common case stays in the wire module."""
    for group in groups:
        encoded = (wire.lb_endpoint(ep, mtls(ep)) for ep in group.endpoints)
        yield wire_py.locality_group(group.label, encoded, group.weight, group.priority)


def load_assignment(cluster_name: str, groups: list[Any]) -> Any:
    return endpoint_pb2.ClusterLoadAssignment(cluster_name=cluster_name, endpoints=groups)


def struct_value(data: dict[str, Any]) -> Any:
    out = struct_pb2.Struct()
    out.update(data)
    return out


@dataclass(frozen=True, slots=True)
class LocalityPlan:
    """A locality setting applied for one calling proxy."""

    setting: Any
    enable_failover: bool
    proxy_locality: str
    proxy_labels: Mapping[str, str]
    #: The setting and what of the proxy it reads (locality_lb.proxy_view): the cache key part.
    key: tuple[object, ...]

    def apply(self, endpoints: list[Endpoint]) -> list[LocalityGroup]:
        groups = locality_lb.groups_by_locality(endpoints)
        return locality_lb.apply(
            groups, self.setting, self.proxy_locality, self.proxy_labels, self.enable_failover
        )


def _cluster_locality(
    rule: Any | None, subset: str, port: int, svc: Service, mesh: Any
) -> tuple[Any, bool, bytes] | None:
    """The locality setting in force for a cluster, whether failover is on, and the setting's bytes."""
    locality = locality_lb.for_cluster(mesh, tp.cluster_policy(rule, subset, port), svc)
    setting = locality.setting
    if setting is None or (not setting.distribute and not locality.failover):
        return None  # nothing to rewrite, whoever calls
    return setting, locality.failover, setting.SerializeToString(deterministic=True)


def locality_plan(
    rule: Any | None, subset: str, port: int, svc: Service, proxy: Any, push: Any
) -> LocalityPlan | None:
    """The locality rewrite of one cluster for ``proxy``, as istiod's endpoint builder decides it.

    The load balancer and outlier detection come from the rule's policy merged
    for the port and subset; failover needs outlier detection. What does not
    depend on the proxy is worked out once per snapshot.
    """
    distribution = svc.traffic_distribution
    if rule is None:
        key: tuple[object, ...] = ("eds-locality", None, distribution)
        found = push.memoized(key, lambda: _cluster_locality(None, "", 0, svc, push.mesh))
    else:
        key = ("eds-locality", rule.fingerprint, subset, port, distribution)
        found = push.memoized(key, lambda: _cluster_locality(rule, subset, port, svc, push.mesh))
    if found is None:
        return None
    setting, enable_failover, setting_bytes = found
    view = locality_lb.proxy_view(setting, enable_failover, proxy.locality.label, proxy.labels)
    if view is None:
        return None
    return LocalityPlan(
        setting, enable_failover, proxy.locality.label, proxy.labels, (setting_bytes, enable_failover, view)
    )


def _locality_inputs(push: Any) -> tuple[bool, tuple[str, ...]]:
    """Whether any assignment of the snapshot can depend on the caller's locality, and the labels
    any ``failoverPriority`` names.

    A rewrite needs ``distribute`` (the mesh's or a rule's) or outlier detection (for failover).
    """
    names: set[str] = set()
    sensitive = False
    mesh_setting = push.mesh.locality_lb_setting
    if locality_lb.effective_setting(mesh_setting, None)[0] is not None:
        sensitive = bool(mesh_setting.distribute)
        names.update(locality_lb.failover_label_names(mesh_setting.failover_priority))
    if any(svc.traffic_distribution == PREFER_CLOSE for svc in push.services):
        sensitive = True
        names.update(locality_lb.PREFER_CLOSE_LABELS)
    for config in push.configs(Kind.DESTINATION_RULE):
        spec = config.spec
        for policy in [spec.traffic_policy, *(s.traffic_policy for s in spec.subsets)]:
            for part in [policy, *policy.port_level_settings]:
                sensitive = sensitive or part.HasField("outlier_detection")
                if part.load_balancer.HasField("locality_lb_setting"):
                    setting = part.load_balancer.locality_lb_setting
                    sensitive = sensitive or bool(setting.distribute)
                    names.update(locality_lb.failover_label_names(setting.failover_priority))
    return sensitive, tuple(sorted(names))


def proxy_signature(proxy: Any, push: Any) -> tuple[object, ...]:
    """What of a proxy any of its assignments can read: its locality and failoverPriority labels.

    Proxies alike in these (and in scope) get the same assignments, so generation is shared;
    without any locality rewrite in the snapshot, all proxies are alike.
    """
    sensitive, labels = push.memoized("eds-locality-inputs", lambda: _locality_inputs(push))
    if not sensitive:
        return ()
    values = tuple(proxy.labels.get(name) for name in labels) if labels else ()
    return (proxy.locality.label, bool(proxy.labels), values)


@dataclass(frozen=True, slots=True)
class ClaInputs:
    """What the ClusterLoadAssignment of one cluster is built from."""

    service: Service
    port_name: str
    subset_labels: dict[str, str] | None
    #: Which endpoints get the mTLS transport socket match.
    tls: EndpointTls
    #: The DestinationRules read (their keys are cache dependencies).
    rule_keys: tuple[ConfigKey, ...] = ()
    #: How the calling proxy's locality rewrites the assignment; None when it does not.
    locality: LocalityPlan | None = None
    #: Only endpoints that take Istio mTLS (``tls.mtls``): an SNI-DNAT cluster's. An AUTO_PASSTHROUGH
    #: gateway cannot see whether the TLS it forwards is mTLS, so, as istiod, it may reach only
    #: endpoints whose listener will demand it.
    mtls_only: bool = False

    def cache_key(self, cluster_name: str) -> int:
        """Everything the assignment depends on besides the endpoints (whose changes evict it).

        Of the proxy, only what its locality plan reads: proxies alike in that share entries.
        """
        svc = self.service
        plan = self.locality.key if self.locality is not None else None
        return hash_value(
            (
                cluster_name,
                svc.fingerprint,
                self.port_name,
                self.subset_labels,
                self.tls.root,
                self.tls.subsets,
                self.tls.peer_key,
                plan,
                self.mtls_only,
            )
        )

    def dependencies(self) -> frozenset[ConfigKey]:
        svc = self.service
        return frozenset((ConfigKey(Kind.SERVICE_ENTRY, svc.hostname, svc.namespace), *self.rule_keys))


def cla_inputs(cluster_name: str, proxy: Any, push: Any) -> ClaInputs | None:
    """Service, port and subset of an outbound cluster as the proxy sees it; None if unknown."""
    parsed = names.parse_cluster(cluster_name)
    if parsed is None or parsed[0] != "outbound":
        return None
    _, port_number, subset, hostname = parsed
    scope = proxy.sidecar_scope
    svc = scope.service(hostname) if scope is not None else None
    if svc is None:
        candidates = push.services_for_hostname(hostname)
        svc = next((s for s in candidates if s.namespace == proxy.config_namespace), None) or (
            candidates[0] if candidates else None
        )
    if svc is None:
        return None
    port = svc.port(port_number)
    if port is None:
        return None
    rule = scope.destination_rule(hostname) if scope is not None else None
    subset_labels: dict[str, str] | None = None
    if subset:
        found = rule.subset(subset) if rule is not None else None
        if found is None:
            return None
        subset_labels = dict(found.labels)
    rule_keys = tuple(c.key for c in rule.configs) if rule is not None else ()
    plan = locality_plan(rule, subset, port_number, svc, proxy, push)
    if rule is None:
        tls = _NO_RULE_TLS
    else:
        tls = push.memoized(
            ("eds-tls", rule.fingerprint, port_number), lambda: endpoint_tls(rule, port_number)
        )
    tls = tls.with_peer(push.peer_authentication)
    return ClaInputs(svc, port.name, subset_labels, tls, rule_keys, plan, names.is_sni_cluster(cluster_name))


def mtls_groups(groups: Iterable[LocalityGroup], mtls: Callable[[Endpoint], bool]) -> list[LocalityGroup]:
    """Each locality with only its endpoints that take Istio mTLS, reweighted. A locality left
    empty stays, with weight 0 (sent without a weight), as istiod's filter leaves it."""
    groups = list(groups)
    kept = locality_lb.groups_by_locality([ep for group in groups for ep in group.endpoints if mtls(ep)])
    by_label = {group.label: group for group in kept}
    return [by_label.get(group.label, replace(group, endpoints=(), weight=0)) for group in groups]


def _planned_groups(inputs: ClaInputs, chosen: list[Endpoint]) -> list[LocalityGroup]:
    """The locality groups of the chosen endpoints, as the inputs' locality plan and filter say."""
    if inputs.locality is not None:
        # istiod filters before the locality rewrite; a locality emptied here is then not sent.
        if inputs.mtls_only:
            chosen = [ep for ep in chosen if inputs.tls.mtls(ep)]
        return inputs.locality.apply(chosen)
    groups = locality_lb.groups_by_locality(chosen)
    return mtls_groups(groups, inputs.tls.mtls) if inputs.mtls_only else groups


def build_cluster_load_assignment(cluster_name: str, proxy: Any, push: Any, index: EndpointIndex) -> Any:
    """The ClusterLoadAssignment as a protobuf object: the reference the wire encoder must equal."""
    inputs = cla_inputs(cluster_name, proxy, push)
    if inputs is None:
        return endpoint_pb2.ClusterLoadAssignment(cluster_name=cluster_name)
    endpoints = select_endpoints(index, inputs.service, inputs.port_name, inputs.subset_labels)
    return load_assignment(cluster_name, render_groups(_planned_groups(inputs, endpoints), inputs.tls.mtls))


def encode_cluster_load_assignment(cluster_name: str, proxy: Any, push: Any, index: EndpointIndex) -> bytes:
    """The serialized ClusterLoadAssignment, encoded without protobuf objects."""
    return encode_from_inputs(cluster_name, cla_inputs(cluster_name, proxy, push), index)


def encode_from_inputs(cluster_name: str, inputs: ClaInputs | None, index: EndpointIndex) -> bytes:
    if inputs is None:
        return wire.cluster_load_assignment(cluster_name, (), "", None, wire.NO_TLS_MODE)
    shards = index.shards(inputs.service.hostname, inputs.service.namespace)
    endpoints = [ep for _, ep in shards.endpoints()] if shards is not None else []
    if inputs.locality is not None or inputs.tls.subsets or inputs.tls.peer is not None or inputs.mtls_only:
        chosen = wire.select(endpoints, inputs.port_name, inputs.subset_labels)
        groups = _planned_groups(inputs, chosen)
        return wire_py.assignment(cluster_name, _encode_groups(groups, inputs.tls.mtls))
    return wire.cluster_load_assignment(
        cluster_name, endpoints, inputs.port_name, inputs.subset_labels, inputs.tls.wire_mode
    )
