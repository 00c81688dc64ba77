"""Clusters for a sidecar (CDS), in istiod's names and shapes.

Order: for each imported service port its default cluster then its subset
clusters; BlackHoleCluster; PassthroughCluster; inbound clusters;
InboundPassthroughCluster.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import address_pb2, base_pb2, config_source_pb2
from envoy.extensions.network.dns_resolver.cares.v3 import cares_dns_resolver_pb2

from meshpilot.model.config import ConfigKey
from meshpilot.model.confighash import hash_value
from meshpilot.model.destination_rules import MergedDestinationRule
from meshpilot.model.endpoint import Endpoint
from meshpilot.model.endpoint_index import EndpointIndex
from meshpilot.model.kind import Kind
from meshpilot.model.mesh import MeshConfig
from meshpilot.model.protocol import Protocol
from meshpilot.model.proxy import InterceptionMode, NodeType, Proxy
from meshpilot.model.push_context import PushContext
from meshpilot.model.service import Port, Registry, Resolution, Service, ServiceTarget
from meshpilot.networking import endpoint as eds
from meshpilot.networking import extensions, locality_lb, metadata_exchange, names
from meshpilot.networking import traffic_policy as tp
from meshpilot.networking.auto_mtls import auto_mtls_applies, service_mtls_mode
from meshpilot.networking.credential_tls import credential_upstream
from meshpilot.networking.policy_problems import PROBLEMS
from meshpilot.networking.protobuf import duration, pack
from meshpilot.networking.tls import (
    TlsSettingsError,
    auto_sni_options,
    istio_mutual_upstream,
    originated_upstream,
    proxy_protocol_socket,
    raw_buffer_transport_socket,
    tls_transport_socket,
)

log = logging.getLogger(__name__)

HTTP_PROTOCOL_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
#: istiod's "never clean up" interval for ORIGINAL_DST clusters (max seconds of a Duration it uses).
_NO_CLEANUP = 9223372035
# Resolutions whose clusters carry their endpoints inline.
_INLINE_ENDPOINTS = (Resolution.DNS_LB, Resolution.DNS_ROUND_ROBIN_LB)
_TYPES = {
    Resolution.CLIENT_SIDE_LB: cluster_pb2.Cluster.EDS,
    Resolution.DNS_LB: cluster_pb2.Cluster.STRICT_DNS,
    Resolution.DNS_ROUND_ROBIN_LB: cluster_pb2.Cluster.LOGICAL_DNS,
    Resolution.PASSTHROUGH: cluster_pb2.Cluster.ORIGINAL_DST,
}


@dataclass(frozen=True, slots=True)
class ClusterInputs:
    """Everything a cluster build reads, so the cache key can name it."""

    proxy: Proxy
    push: PushContext
    index: EndpointIndex


def ads_config_source() -> Any:
    return config_source_pb2.ConfigSource(
        ads=config_source_pb2.AggregatedConfigSource(),
        initial_fetch_timeout=duration(0),
        resource_api_version=config_source_pb2.V3,
    )


def config_path(kind_path: str, namespace: str, name: str) -> str:
    """The ``istio.config`` metadata value naming the Istio config a resource came from."""
    return f"/apis/networking.istio.io/v1/namespaces/{namespace}/{kind_path}/{name}"


def _metadata(svc: Service | None, rule: MergedDestinationRule | None, subset: str) -> Any:
    meta = base_pb2.Metadata()
    istio: dict[str, Any] = {}
    if rule is not None:
        istio["config"] = config_path("destination-rule", rule.first.namespace, rule.first.name)
    if subset:
        istio["subset"] = subset
    if svc is not None:
        # istiod's telemetry metadata names the service of every outbound cluster, external or not.
        istio["services"] = [{"host": svc.hostname, "name": svc.name, "namespace": svc.namespace}]
    if svc is not None and svc.mesh_external:
        istio["external"] = True
    if istio:
        meta.filter_metadata["istio"].update(istio)
    return meta


def _set_protocol_options(cluster: Any, options: Any) -> None:
    if options.ByteSize():
        if options.WhichOneof("upstream_protocol_options") is None:
            # Envoy requires a protocol choice; options set only for timeouts mean HTTP/1.1 (as istiod).
            options.explicit_http_config.http_protocol_options.SetInParent()
        cluster.typed_extension_protocol_options[HTTP_PROTOCOL_OPTIONS].CopyFrom(pack(options))


def _upstream_options(port: Port) -> Any:
    return tp.http_protocol_options_for(port.protocol.is_http2, port.protocol is Protocol.UNSUPPORTED)


def build_outbound_cluster(
    inputs: ClusterInputs,
    svc: Service,
    port: Port,
    subset: str,
    rule: MergedDestinationRule | None,
    *,
    sni_dnat: bool = False,
) -> Any | None:
    """One ``outbound|port|subset|host`` cluster; None when it must not exist (DNS without endpoints).

    ``sni_dnat``: the cluster an AUTO_PASSTHROUGH gateway forwards to (``auto_passthrough``), named
    ``outbound_.port_.subset_.host``, without TLS or PROXY protocol of its own (the client's TLS
    passes through) and with only the endpoints that take Istio mTLS.
    """
    proxy, push = inputs.proxy, inputs.push
    mesh = push.mesh
    if sni_dnat:
        name = names.sni_cluster(port.port, subset, svc.hostname)
    else:
        name = names.outbound_cluster(port.port, subset, svc.hostname)
    policy = tp.cluster_policy(rule, subset, port.port)
    cluster_type = _TYPES.get(svc.resolution, cluster_pb2.Cluster.EDS)
    if policy.is_passthrough_lb:
        cluster_type = cluster_pb2.Cluster.ORIGINAL_DST
    cluster = cluster_pb2.Cluster(name=name, type=cluster_type, alt_stat_name=names.stat_name(name))
    cluster.connect_timeout.CopyFrom(mesh.connect_timeout)
    cluster.common_lb_config.SetInParent()
    dns_endpoints: list[Endpoint] = []
    if cluster_type == cluster_pb2.Cluster.EDS:
        cluster.eds_cluster_config.service_name = name
        cluster.eds_cluster_config.eds_config.CopyFrom(ads_config_source())
    elif cluster_type in (cluster_pb2.Cluster.STRICT_DNS, cluster_pb2.Cluster.LOGICAL_DNS):
        subset_labels = _subset_labels(rule, subset)
        endpoints = eds.select_endpoints(inputs.index, svc, port.name, subset_labels, allow_hostnames=True)
        if not endpoints:
            return None
        if cluster_type == cluster_pb2.Cluster.LOGICAL_DNS:
            endpoints = endpoints[:1]  # Envoy takes exactly one host for LOGICAL_DNS
        cluster.dns_lookup_family = _dns_family(proxy)
        cluster.respect_dns_ttl = True
        cluster.dns_refresh_rate.CopyFrom(mesh.dns_refresh_rate)
        _dns_resolver(cluster)
        dns_endpoints = endpoints
    elif cluster_type == cluster_pb2.Cluster.ORIGINAL_DST and _passthrough_target_port(svc, port):
        # A ServiceEntry with resolution NONE may send to another port than the one called.
        override = cluster.original_dst_lb_config.upstream_port_override
        override.value = _passthrough_target_port(svc, port)
    http_options = _upstream_options(port)
    # Upgrade first so HTTP/2 pool settings (maxConcurrentStreams) land on the upgraded options.
    if tp.should_h2_upgrade(policy.connection_pool, port.protocol, mesh):
        tp.set_h2(http_options)
    tp.apply_connection_pool(cluster, policy.connection_pool, http_options, mesh)
    tp.apply_outlier_detection(cluster, policy.outlier_detection)
    locality = locality_lb.for_cluster(mesh, policy, svc)
    tp.apply_load_balancer(cluster, policy.load_balancer, locality.setting, locality.forced)
    if cluster.type in (cluster_pb2.Cluster.STRICT_DNS, cluster_pb2.Cluster.LOGICAL_DNS):
        mtls = _inline_tls(push, rule, port.port).mtls
        if sni_dnat and locality.setting is not None:
            dns_endpoints = [ep for ep in dns_endpoints if mtls(ep)]
        groups = locality_lb.groups_by_locality(dns_endpoints)
        if locality.setting is not None:
            # As istiod for static assignments: relative to the proxy, without failoverPriority.
            groups = locality_lb.apply(groups, locality.setting, proxy.locality.label, {}, locality.failover)
        elif sni_dnat:
            groups = eds.mtls_groups(groups, mtls)
        cluster.load_assignment.CopyFrom(eds.load_assignment(name, eds.render_groups(groups, mtls)))
    cluster.metadata.CopyFrom(_metadata(svc, rule, subset))
    if rule is not None and policy.tls is not None and policy.tls.mode in (eds.TLS_SIMPLE, eds.TLS_MUTUAL):
        # As istiod: the application's ALPN is not replaced on TLS the proxy originates.
        cluster.metadata.filter_metadata["istio"].update({"alpn_override": "false"})
    if extensions.has_upstream_metadata_exchange(proxy):
        cluster.filters.append(metadata_exchange.cluster_filter())
    if not sni_dnat:
        # TLS before the protocol options are packed: origination may add auto SNI to them.
        _apply_tls(cluster, inputs, svc, port, subset, rule, policy, http_options)
        if policy.proxy_protocol is not None:
            _apply_proxy_protocol(cluster, policy.proxy_protocol.version)
    _set_protocol_options(cluster, http_options)
    return cluster


def template_inputs(svc: Service, port: Port, policy: tp.ClusterPolicy) -> Hashable:
    """What ``build_outbound_cluster`` reads of the service, port and rule for an EDS cluster, besides
    what ``cluster_wire`` writes per cluster (name, metadata, TLS) and the snapshot and proxy.

    Clusters equal in these share one template (``cluster_wire``): the resolved policy, not the rule
    it came from, so rules with the same policy share; the port's protocol (protocol options, HTTP/2
    upgrade); and whether the Service prefers close endpoints (locality balancing without a rule).
    """
    return (policy.fingerprint, port.protocol.value, locality_lb.prefers_close(svc))


def _inline_tls(push: PushContext, rule: MergedDestinationRule | None, port: int) -> eds.EndpointTls:
    return eds.endpoint_tls(rule, port).with_peer(push.peer_authentication)


def _passthrough_target_port(svc: Service, port: Port) -> int:
    """The targetPort of a resolution NONE ServiceEntry port (istiod's PassthroughTargetPorts), else 0.

    Other resolutions keep their targetPort on the endpoints, not the cluster.
    """
    passthrough = svc.registry is Registry.EXTERNAL and svc.resolution is Resolution.PASSTHROUGH
    if passthrough and isinstance(port.target_port, int):
        return port.target_port
    return 0


def _subset_labels(rule: MergedDestinationRule | None, subset: str) -> dict[str, str] | None:
    if rule is None or not subset:
        return None
    found = rule.subset(subset)
    return dict(found.labels) if found is not None else None


#: istiod's defaults: PILOT_DNS_CARES_UDP_MAX_QUERIES (100) caps the queries on one UDP socket, and
#: PILOT_DNS_JITTER_DURATION (100 ms) spreads the refreshes of many proxies resolving one name.
_CARES_UDP_MAX_QUERIES = 100
_DNS_JITTER_SECONDS = 0.1


def _dns_resolver(cluster: Any) -> None:
    """The c-ares resolver and refresh jitter istiod gives every DNS-resolved cluster."""
    resolver = cluster.typed_dns_resolver_config
    resolver.name = "envoy.network.dns_resolver.cares"
    config = cares_dns_resolver_pb2.CaresDnsResolverConfig()
    config.udp_max_queries.value = _CARES_UDP_MAX_QUERIES
    resolver.typed_config.CopyFrom(pack(config))
    cluster.dns_jitter.CopyFrom(duration(_DNS_JITTER_SECONDS))


def _dns_family(proxy: Proxy) -> Any:
    return cluster_pb2.Cluster.V6_ONLY if proxy.ipv6_only else cluster_pb2.Cluster.V4_ONLY


def _apply_proxy_protocol(cluster: Any, version: int) -> None:
    """A PROXY protocol header first: every transport socket wrapped (istiod's applyUpstreamProxyProtocol)."""
    if not cluster.HasField("transport_socket") and not cluster.transport_socket_matches:
        cluster.transport_socket.CopyFrom(proxy_protocol_socket(version, raw_buffer_transport_socket()))
        return
    if cluster.HasField("transport_socket"):
        inner = base_pb2.TransportSocket()
        inner.CopyFrom(cluster.transport_socket)
        cluster.transport_socket.CopyFrom(proxy_protocol_socket(version, inner))
    for match in cluster.transport_socket_matches:
        inner = base_pb2.TransportSocket()
        inner.CopyFrom(match.transport_socket)
        match.transport_socket.CopyFrom(proxy_protocol_socket(version, inner))


def _apply_originated_tls(
    cluster: Any,
    proxy: Proxy,
    push: PushContext,
    svc: Service,
    tls: Any,
    http_options: Any,
    rule: MergedDestinationRule | None,
) -> None:
    """SIMPLE or MUTUAL: TLS the proxy originates to a server outside the mesh's identity."""
    # A ServiceEntry's subjectAltNames stand in when the rule names none.
    sans = list(tls.subject_alt_names)
    if not sans and svc.registry is Registry.EXTERNAL:
        sans = list(push.service_accounts(svc))
    explicit = http_options.explicit_http_config
    http2 = http_options.HasField("explicit_http_config") and explicit.HasField("http2_protocol_options")
    if tls.credential_name:
        if proxy.type is NodeType.SIDECAR and (rule is None or rule.selector is None):
            # istiod leaves this cluster without TLS (plaintext) so that sidecars without access to the
            # Secret do not start late; meshpilot will not send in plaintext what the rule says to
            # encrypt: the context stays, and the rule is reported.
            first = rule.first if rule is not None else None
            PROBLEMS.record(
                "DestinationRule",
                f"{first.namespace}/{first.name}" if first is not None else cluster.name,
                "tls.credentialName in a DestinationRule without a workloadSelector: istiod sends "
                f"sidecars plaintext on {cluster.name}; meshpilot keeps TLS with the Secret over SDS",
            )
        auto_sni_options(tls, http_options)
        context = credential_upstream(tls, sans, push.mesh, http2=http2)
        cluster.transport_socket.CopyFrom(tls_transport_socket(context))
        return
    try:
        context = originated_upstream(tls, sans, push.mesh, http2=http2, mutual=tls.mode == eds.TLS_MUTUAL)
    except TlsSettingsError as err:
        # As istiod: the cluster stays, without TLS, and the reason is logged.
        log.error("failed to apply tls setting for %s: %s", cluster.name, err)
        return
    auto_sni_options(tls, http_options)
    cluster.transport_socket.CopyFrom(tls_transport_socket(context))


def _apply_tls(
    cluster: Any,
    inputs: ClusterInputs,
    svc: Service,
    port: Port,
    subset: str,
    rule: MergedDestinationRule | None,
    policy: tp.ClusterPolicy,
    http_options: Any,
) -> None:
    """Explicit DestinationRule TLS, else auto mTLS for in-mesh services, as istiod decides
    (``auto_mtls``: not to a service whose PeerAuthentication mode is DISABLE)."""
    proxy, push = inputs.proxy, inputs.push
    sni = names.sni_cluster(port.port, subset, svc.hostname)
    alpn = extensions.mtls_client_alpn(proxy, http2=port.protocol.is_http2)
    if policy.tls is not None:
        tls = policy.tls
        if tls.mode == eds.TLS_ISTIO_MUTUAL:
            sans = list(tls.subject_alt_names) or list(push.service_accounts(svc))
            context = istio_mutual_upstream(tls.sni or sni, sans, alpn)
            cluster.transport_socket.CopyFrom(tls_transport_socket(context))
        elif tls.mode in (eds.TLS_SIMPLE, eds.TLS_MUTUAL):
            _apply_originated_tls(cluster, proxy, push, svc, tls, http_options, rule)
        # DISABLE means plaintext, and no auto mTLS either.
        return
    if not auto_mtls_applies(service_mtls_mode(push, inputs.index, svc, port, rule, subset), push):
        return
    context = istio_mutual_upstream(sni, push.service_accounts(svc), alpn)
    if cluster.type == cluster_pb2.Cluster.ORIGINAL_DST:
        # Headless: every endpoint gets TLS; istiod does not use matches here.
        cluster.transport_socket.CopyFrom(tls_transport_socket(context))
        return
    cluster.transport_socket_matches.add(
        name="tlsMode-istio",
        match=eds.struct_value({"tlsMode": "istio"}),
        transport_socket=tls_transport_socket(context),
    )
    cluster.transport_socket_matches.add(
        name="tlsMode-disabled", match=eds.struct_value({}), transport_socket=raw_buffer_transport_socket()
    )


def blackhole_cluster(mesh: Any) -> Any:
    cluster = cluster_pb2.Cluster(
        name=names.BLACKHOLE_CLUSTER,
        type=cluster_pb2.Cluster.STATIC,
        alt_stat_name=names.stat_name(names.BLACKHOLE_CLUSTER),
    )
    cluster.connect_timeout.CopyFrom(mesh.connect_timeout)
    return cluster


def passthrough_cluster(proxy: Proxy, mesh: Any, *, inbound: bool = False) -> Any:
    name = names.INBOUND_PASSTHROUGH_CLUSTER if inbound else names.PASSTHROUGH_CLUSTER
    cluster = cluster_pb2.Cluster(
        name=name,
        type=cluster_pb2.Cluster.ORIGINAL_DST,
        lb_policy=cluster_pb2.Cluster.CLUSTER_PROVIDED,
        # istiod copies the outbound passthrough cluster and keeps its stat name.
        alt_stat_name=names.stat_name(names.PASSTHROUGH_CLUSTER),
    )
    cluster.connect_timeout.CopyFrom(mesh.connect_timeout)
    options = tp.http_protocol_options_for(False, True)
    options.common_http_protocol_options.idle_timeout.CopyFrom(duration(300))
    _set_protocol_options(cluster, options)
    cluster.circuit_breakers.CopyFrom(tp.default_circuit_breakers())
    if inbound:
        cluster.upstream_bind_config.CopyFrom(_inbound_bind(proxy))
    elif extensions.has_upstream_metadata_exchange(proxy):
        cluster.filters.append(metadata_exchange.cluster_filter())
    return cluster


def _inbound_bind(proxy: Proxy) -> Any:
    source = names.INBOUND_PASSTHROUGH_BIND_IPV6 if proxy.ipv6_only else names.INBOUND_PASSTHROUGH_BIND_IPV4
    return address_pb2.BindConfig(source_address=address_pb2.SocketAddress(address=source, port_value=0))


def inbound_cluster(
    proxy: Proxy,
    mesh: Any,
    port: int,
    protocol: Protocol,
    services: list[Service],
    *,
    endpoint: tuple[str, int] | None = None,
    pool: Any | None = None,
) -> Any:
    """``inbound|port||``: to the app, by original destination or a fixed endpoint.

    ``pool`` is the Sidecar's connection pool for the port (istiod's
    InboundConnectionPoolForPort): its limits protect the app.
    """
    name = names.inbound_cluster(port)
    cluster = cluster_pb2.Cluster(name=name, alt_stat_name=names.stat_name(name))
    cluster.connect_timeout.CopyFrom(mesh.connect_timeout)
    cluster.common_lb_config.SetInParent()
    cluster.circuit_breakers.CopyFrom(tp.default_circuit_breakers())
    localhost = endpoint is not None and endpoint[0] in ("127.0.0.1", "::1")
    if endpoint is None:
        cluster.type = cluster_pb2.Cluster.ORIGINAL_DST
        cluster.lb_policy = cluster_pb2.Cluster.CLUSTER_PROVIDED
        cluster.cleanup_interval.seconds = _NO_CLEANUP
    else:
        cluster.type = cluster_pb2.Cluster.STATIC
        cluster.load_assignment.cluster_name = name
        group = cluster.load_assignment.endpoints.add()
        group.lb_endpoints.add().endpoint.address.CopyFrom(eds.socket_address(*endpoint))
    if not localhost:
        cluster.upstream_bind_config.CopyFrom(_inbound_bind(proxy))
    services_meta = [{"host": s.hostname, "name": s.name, "namespace": s.namespace} for s in services]
    if services_meta:
        cluster.metadata.filter_metadata["istio"].update({"services": services_meta})
    options = tp.http_protocol_options_for(protocol.is_http2, protocol is Protocol.UNSUPPORTED)
    if pool is not None:
        tp.apply_connection_pool(cluster, pool, options, mesh)
    _set_protocol_options(cluster, options)
    return cluster


def _inbound_clusters(proxy: Proxy, mesh: Any) -> list[Any]:
    scope = proxy.sidecar_scope
    if scope is not None and scope.has_ingress:
        built = (_ingress_cluster(proxy, mesh, ingress) for ingress in scope.ingress)
        return [c for c in built if c is not None]
    if proxy.interception_mode is InterceptionMode.NONE:
        return []
    by_port: dict[int, list[ServiceTarget]] = {}
    for target in proxy.service_targets:
        by_port.setdefault(target.target_port, []).append(target)
    out = []
    localhost_mode = mesh.inbound_traffic_policy.mode == MeshConfig.InboundTrafficPolicy.LOCALHOST
    for port in sorted(by_port):
        targets = by_port[port]
        services = [t.service for t in targets if t.port.port == targets[0].port.port]
        endpoint = ("127.0.0.1", port) if localhost_mode else None
        pool = scope.inbound_connection_pool(port) if scope is not None else None
        protocol = targets[0].port.protocol
        out.append(inbound_cluster(proxy, mesh, port, protocol, services, endpoint=endpoint, pool=pool))
    return out


def parse_default_endpoint(text: str, proxy: Proxy) -> tuple[str, int] | None:
    """Where a Sidecar ingress ``defaultEndpoint`` sends traffic, as istiod resolves it.

    ``127.0.0.1:P`` / ``[::1]:P`` is loopback, ``0.0.0.0:P`` the proxy's first
    IPv4 address (loopback if it has none), ``[::]:P`` its first IPv6 address
    (``::1`` if none), ``unix://path`` the socket. None when ``text`` cannot be
    parsed (validation rejects that first).
    """
    if text.startswith("unix://"):
        return (text, 0)
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit():
        return None
    host = host.removeprefix("[").removesuffix("]")
    port = int(port_text)
    if host == "0.0.0.0":
        host = next((ip for ip in proxy.ip_addresses if ":" not in ip), "127.0.0.1")
    elif host == "::":
        host = next((ip for ip in proxy.ip_addresses if ":" in ip), "::1")
    return (host, port)


def _ingress_cluster(proxy: Proxy, mesh: Any, ingress: Any) -> Any | None:
    number = ingress.port.number
    protocol = Protocol.parse(ingress.port.protocol)
    endpoint = None
    if ingress.default_endpoint:
        endpoint = parse_default_endpoint(ingress.default_endpoint, proxy)
        if endpoint is None:
            return None  # istiod skips the cluster rather than guess
    # The first service whose target port this is names the cluster's telemetry metadata
    # (istiod's findOrCreateService; its stand-in for no service carries none).
    targets = [t.service for t in proxy.service_targets if t.target_port == number][:1]
    scope = proxy.sidecar_scope
    pool = scope.inbound_connection_pool(number) if scope is not None else None
    return inbound_cluster(proxy, mesh, number, protocol, targets, endpoint=endpoint, pool=pool)


@dataclass(frozen=True, slots=True)
class OutboundSpec:
    """One outbound cluster to build: a service port, maybe a subset, and the rule for the host."""

    service: Service
    port: Port
    subset: str
    rule: MergedDestinationRule | None

    @property
    def name(self) -> str:
        return names.outbound_cluster(self.port.port, self.subset, self.service.hostname)

    def cache_key(self, inputs: ClusterInputs) -> int:
        """Exactly what build_outbound_cluster reads besides endpoints (whose changes evict it)."""
        proxy, push = inputs.proxy, inputs.push
        return hash_value(
            (
                self.name,
                self.service.fingerprint,
                self.rule.fingerprint if self.rule is not None else 0,
                push.service_accounts(self.service),
                push.mesh_fingerprint,
                # The service's PeerAuthentication mode decides auto mTLS (auto_mtls.py); the
                # passthrough part of that rule reads endpoints, whose changes evict the entry.
                push.peer_authentication.service_mode(self.service.namespace)
                if push.peer_authentication
                else None,
                extensions.has_upstream_metadata_exchange(proxy),
                int(_dns_family(proxy)),
                # Only DNS clusters' inline endpoints read the proxy's locality; the check
                # is inline because a method call per cluster is a fifth of the key's cost.
                (self._dns_locality_view(proxy, push), _inline_tls(push, self.rule, self.port.port).peer_key)
                if self.service.resolution in _INLINE_ENDPOINTS
                else None,
            )
        )

    def _dns_locality_view(self, proxy: Proxy, push: PushContext) -> object:
        """What of the proxy's locality a DNS cluster's inline endpoints depend on (None: nothing)."""
        policy = tp.cluster_policy(self.rule, self.subset, self.port.port)
        locality = locality_lb.for_cluster(push.mesh, policy, self.service)
        return locality_lb.proxy_view(locality.setting, locality.failover, proxy.locality.label, {})

    def dependencies(self) -> frozenset[ConfigKey]:
        svc = self.service
        keys = [ConfigKey(Kind.SERVICE_ENTRY, svc.hostname, svc.namespace)]
        if self.rule is not None:
            keys.extend(c.key for c in self.rule.configs)
        return frozenset(keys)


def outbound_specs(proxy: Proxy) -> list[OutboundSpec]:
    """The outbound clusters of a sidecar: each imported service port, then its subsets."""
    scope = proxy.sidecar_scope
    assert scope is not None, "the sidecar scope is computed before generation"
    out = []
    for svc in scope.services:
        if svc.resolution is Resolution.ALIAS:
            continue
        rule = scope.destination_rule(svc.hostname)
        for port in svc.ports:
            if port.protocol is Protocol.UDP:
                continue
            out.append(OutboundSpec(svc, port, "", rule))
            if rule is not None:
                out.extend(OutboundSpec(svc, port, subset.name, rule) for subset in rule.subsets)
    return out


def other_clusters(inputs: ClusterInputs) -> list[Any]:
    """BlackHole, Passthrough, inbound and InboundPassthrough clusters, in istiod's order."""
    proxy, push = inputs.proxy, inputs.push
    return [
        blackhole_cluster(push.mesh),
        passthrough_cluster(proxy, push.mesh),
        *_inbound_clusters(proxy, push.mesh),
        passthrough_cluster(proxy, push.mesh, inbound=True),
    ]


def build_clusters(inputs: ClusterInputs) -> list[Any]:
    """Every cluster of a sidecar, in istiod's order, names unique (first wins)."""
    out: list[Any] = []
    for spec in outbound_specs(inputs.proxy):
        cluster = build_outbound_cluster(inputs, spec.service, spec.port, spec.subset, spec.rule)
        if cluster is not None:
            out.append(cluster)
    out.extend(other_clusters(inputs))
    seen: set[str] = set()
    unique = []
    for cluster in out:
        if cluster.name not in seen:
            seen.add(cluster.name)
            unique.append(cluster)
    return unique
