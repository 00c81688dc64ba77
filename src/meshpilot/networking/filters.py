"""Network and HTTP filters of sidecar listeners: tcp_proxy, the HTTP connection manager."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from envoy.config.core.v3 import protocol_pb2
from envoy.config.listener.v3 import listener_components_pb2
from envoy.extensions.filters.http.cors.v3 import cors_pb2
from envoy.extensions.filters.http.fault.v3 import fault_pb2
from envoy.extensions.filters.http.grpc_stats.v3 import config_pb2 as grpc_stats_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from envoy.extensions.request_id.uuid.v3 import uuid_pb2
from xds.type.v3 import typed_struct_pb2

from meshpilot.model.proxy import Proxy
from meshpilot.networking import extensions
from meshpilot.networking.cluster import ads_config_source
from meshpilot.networking.protobuf import boolean, duration, pack

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
) -> Any:
    """A tcp_proxy to one cluster, or to ``weighted`` (cluster, weight) pairs when given."""
    config = tcp_proxy_pb2.TcpProxy(stat_prefix=stat_prefix or cluster)
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


def _metadata_exchange_http(inbound: bool) -> Any:
    direction = "downstream" if inbound else "upstream"
    config = typed_struct_pb2.TypedStruct(type_url="type.googleapis.com/io.istio.http.peer_metadata.Config")
    config.value.update(
        {
            f"{direction}_discovery": [{"istio_headers": {}}, {"workload_discovery": {}}],
            f"{direction}_propagation": [{"istio_headers": {}}],
        }
    )
    return hcm_pb2.HttpFilter(name=extensions.METADATA_EXCHANGE, typed_config=pack(config))


def _alpn_filter() -> Any:
    config = typed_struct_pb2.TypedStruct(
        type_url="type.googleapis.com/istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig"
    )
    config.value.update(
        {
            "alpn_override": [
                {"upstream_protocol": "HTTP10", "alpn_override": ["istio-http/1.0", "istio", "http/1.0"]},
                {"upstream_protocol": "HTTP11", "alpn_override": ["istio-http/1.1", "istio", "http/1.1"]},
                {"upstream_protocol": "HTTP2", "alpn_override": ["istio-h2", "istio", "h2"]},
            ]
        }
    )
    return hcm_pb2.HttpFilter(name=extensions.ALPN, typed_config=pack(config))


def http_filters(proxy: Proxy, *, inbound: bool, security: Sequence[Any] = ()) -> list[Any]:
    """istiod's filter order; Istio-build-only filters only for proxies that have them.

    ``security`` (authorization and JWT filters) comes right after metadata exchange, which must
    run first so RBAC can read the peer's metadata.
    """
    out = []
    if extensions.has_metadata_exchange(proxy):
        out.append(_metadata_exchange_http(inbound))
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
    out.append(_http_filter("envoy.filters.http.router", router_pb2.Router()))
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
) -> Any:
    """An HCM with either RDS (outbound) or an inline route (inbound).

    A gateway's takes the client's address from the connection (``use_remote_address``): it is
    the mesh's edge, so the address is not another proxy's.
    """
    hcm = hcm_pb2.HttpConnectionManager(
        stat_prefix=stat_prefix,
        codec_type=hcm_pb2.HttpConnectionManager.AUTO,
        http_filters=http_filters(proxy, inbound=inbound, security=security),
        use_remote_address=boolean(gateway),
        normalize_path=boolean(True),
        path_with_escaped_slashes_action=hcm_pb2.HttpConnectionManager.KEEP_UNCHANGED,
        upgrade_configs=[hcm_pb2.HttpConnectionManager.UpgradeConfig(upgrade_type="websocket")],
        stream_idle_timeout=duration(0),
        proxy_100_continue=True,
    )
    hcm.request_id_extension.typed_config.CopyFrom(
        pack(uuid_pb2.UuidRequestIdConfig(use_request_id_for_trace_sampling=boolean(True)))
    )
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
