"""Network and HTTP filters of sidecar listeners: tcp_proxy, the HTTP connection manager."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from envoy.config.core.v3 import protocol_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.extensions.filters.http.cors.v3 import cors_pb2
from envoy.extensions.filters.http.fault.v3 import fault_pb2
from envoy.extensions.filters.http.grpc_stats.v3 import config_pb2 as grpc_stats_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from envoy.extensions.request_id.uuid.v3 import uuid_pb2

from meshpilot._proto.istio.envoy.alpn import config_pb2 as alpn_pb2
from meshpilot.model.proxy import Proxy
from meshpilot.networking import extensions, metadata_exchange
from meshpilot.networking.cluster import ads_config_source
from meshpilot.networking.protobuf import boolean, duration, pack
from meshpilot.networking.tracing import HcmTracing

HCM = "envoy.filters.network.http_connection_manager"
TCP_PROXY = "envoy.filters.network.tcp_proxy"


@dataclass(frozen=True, slots=True)
class TcpProxyOptions:
    """tcp_proxy settings a DestinationRule's connection pool and load balancer give."""

    #: Durations as the DestinationRule holds them (google.protobuf.Duration), or None.
    idle_timeout: Any | None = None
    max_connection_duration: Any | None = None
    #: consistentHash.useSourceIp: the same client keeps its upstream among weighted clusters.
    hash_source_ip: bool = False


def tcp_proxy(
    cluster: str,
    stat_prefix: str | None = None,
    *,
    weighted: Sequence[tuple[str, int]] = (),
    options: TcpProxyOptions | None = None,
    access_log: Sequence[Any] = (),
) -> Any:
    """A tcp_proxy to one cluster, or to ``weighted`` (cluster, weight) pairs when given.

    ``access_log``: the connection's loggers (``access_log.filter_loggers``).
    """
    config = tcp_proxy_pb2.TcpProxy(stat_prefix=stat_prefix or cluster, access_log=access_log)
    if weighted:
        for name, weight in weighted:
            config.weighted_clusters.clusters.add(name=name, weight=weight)
    else:
        config.cluster = cluster
    if options is not None:
        if options.idle_timeout is not None:
            config.idle_timeout.CopyFrom(options.idle_timeout)
        if options.max_connection_duration is not None:
            config.max_downstream_connection_duration.CopyFrom(options.max_connection_duration)
        if options.hash_source_ip:
            config.hash_policy.add().source_ip.SetInParent()
    return listener_components_pb2.Filter(name=TCP_PROXY, typed_config=pack(config))


def _http_filter(name: str, config: Any) -> Any:
    return hcm_pb2.HttpFilter(name=name, typed_config=pack(config))


def _alpn_filter() -> Any:
    config = alpn_pb2.FilterConfig()
    for protocol, offered in (
        (alpn_pb2.FilterConfig.HTTP10, ["istio-http/1.0", "istio", "http/1.0"]),
        (alpn_pb2.FilterConfig.HTTP11, ["istio-http/1.1", "istio", "http/1.1"]),
        (alpn_pb2.FilterConfig.HTTP2, ["istio-h2", "istio", "h2"]),
    ):
        config.alpn_override.add(upstream_protocol=protocol, alpn_override=offered)
    return hcm_pb2.HttpFilter(name=extensions.ALPN, typed_config=pack(config))


def http_filters(
    proxy: Proxy, *, inbound: bool, security: Sequence[Any] = (), stats: Sequence[Any] = ()
) -> list[Any]:
    """istiod's filter order; Istio-build-only filters only for proxies that have them.

    ``security`` (authorization and JWT filters) comes right after metadata exchange, which must
    run first so RBAC can read the peer's metadata; ``stats`` (``stats_filters``) after cors.
    """
    out = []
    if extensions.has_peer_metadata(proxy):
        out.append(metadata_exchange.http_filter(inbound=inbound))
    out.extend(security)
    out.append(
        _http_filter(
            "envoy.filters.http.grpc_stats",
            grpc_stats_pb2.FilterConfig(emit_filter_state=True, stats_for_all_methods=boolean(False)),
        )
    )
    if not inbound and extensions.has_alpn_filter(proxy):
        out.append(_alpn_filter())
    out.append(_http_filter("envoy.filters.http.fault", fault_pb2.HTTPFault()))
    out.append(_http_filter("envoy.filters.http.cors", cors_pb2.Cors()))
    out.extend(stats)
    out.append(_http_filter("envoy.filters.http.router", router_pb2.Router()))
    return out


def set_tracing(hcm: Any, tracing: HcmTracing | None) -> None:
    """All that tracing sets on an HCM: its ``tracing`` block, and whether the request ID decides
    sampling. ``retraced`` relies on nothing else of an HCM depending on tracing."""
    if tracing is not None and tracing.tracing is not None:
        hcm.tracing.CopyFrom(tracing.tracing)
    else:
        hcm.ClearField("tracing")
    sample_by_request_id = tracing is None or tracing.use_request_id_for_trace_sampling
    hcm.request_id_extension.typed_config.CopyFrom(
        pack(uuid_pb2.UuidRequestIdConfig(use_request_id_for_trace_sampling=boolean(sample_by_request_id)))
    )


def _chains(listener: Any) -> list[Any]:
    default = [listener.default_filter_chain] if listener.HasField("default_filter_chain") else []
    return [*listener.filter_chains, *default]


def holds_hcm(listener: Any) -> bool:
    return any(f.name == HCM for chain in _chains(listener) for f in chain.filters)


def retraced(listener: Any, tracing: HcmTracing) -> Any:
    """A copy of ``listener`` whose HCMs carry ``tracing`` instead.

    Outbound listeners differ between the workloads sharing them (the scopes of one outbound
    signature, ``generators.lds``) only in their HCMs' tracing (Istio's tags name the workload and
    its namespace), so they are built once and re-traced per workload.
    """

    out = listener_pb2.Listener()
    out.CopyFrom(listener)
    for chain in _chains(out):
        for found in chain.filters:
            if found.name == HCM:
                hcm = hcm_pb2.HttpConnectionManager()
                found.typed_config.Unpack(hcm)
                set_tracing(hcm, tracing)
                found.typed_config.CopyFrom(pack(hcm))
    return out


def http_connection_manager(
    proxy: Proxy,
    *,
    stat_prefix: str,
    inbound: bool,
    rds_name: str | None = None,
    route_config: Any | None = None,
    http2: bool = False,
    gateway: bool = False,
    security: Sequence[Any] = (),
    stats: Sequence[Any] = (),
    access_log: Sequence[Any] = (),
    tracing: HcmTracing | None = None,
) -> Any:
    """An HCM with either RDS (outbound) or an inline route (inbound).

    ``access_log`` and ``tracing`` come from ``access_log.filter_loggers`` and ``tracing.hcm_tracing``.

    A gateway's takes the client's address from the connection (``use_remote_address``): it is
    the mesh's edge, so the address is not another proxy's.
    """
    hcm = hcm_pb2.HttpConnectionManager(
        stat_prefix=stat_prefix,
        codec_type=hcm_pb2.HttpConnectionManager.AUTO,
        http_filters=http_filters(proxy, inbound=inbound, security=security, stats=stats),
        use_remote_address=boolean(gateway),
        normalize_path=boolean(True),
        path_with_escaped_slashes_action=hcm_pb2.HttpConnectionManager.KEEP_UNCHANGED,
        upgrade_configs=[hcm_pb2.HttpConnectionManager.UpgradeConfig(upgrade_type="websocket")],
        stream_idle_timeout=duration(0),
        proxy_100_continue=True,
        access_log=access_log,
    )
    set_tracing(hcm, tracing)
    if rds_name is not None:
        hcm.rds.config_source.CopyFrom(ads_config_source())
        hcm.rds.route_config_name = rds_name
    elif route_config is not None:
        hcm.route_config.CopyFrom(route_config)
    if inbound:
        hcm.forward_client_cert_details = hcm_pb2.HttpConnectionManager.APPEND_FORWARD
        hcm.set_current_client_cert_details.subject.value = True
        hcm.set_current_client_cert_details.uri = True
        hcm.set_current_client_cert_details.dns = True
        hcm.server_name = "istio-envoy"
    if gateway:
        # istiod's gateway HCM: the client's certificate details replace any XFCC header a client sent
        # (it is the mesh's edge), and responses name the server as a sidecar's do.
        hcm.forward_client_cert_details = hcm_pb2.HttpConnectionManager.SANITIZE_SET
        details = hcm.set_current_client_cert_details
        details.subject.value = True
        details.cert = details.dns = details.uri = True
        hcm.server_name = "istio-envoy"
        hcm.http_protocol_options.SetInParent()
    if http2:
        hcm.http2_protocol_options.CopyFrom(protocol_pb2.Http2ProtocolOptions())
    return listener_components_pb2.Filter(name=HCM, typed_config=pack(hcm))
