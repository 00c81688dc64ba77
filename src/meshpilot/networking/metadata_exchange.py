"""Istio's metadata exchange filters, as istiod 1.28 configures them by default.

Peers swap workload metadata (labels, names) so that Istio's metrics carry both sides:

- over TCP with mutual TLS, the upstream network filter on outbound clusters (and
  PassthroughCluster) writes the exchange at the start of the connection when the server agreed to
  the ``istio-peer-exchange`` ALPN, and the network filter first on a server's inbound chains reads
  and strips it; a chain that advertises the ALPN without that filter would pass the exchange to
  the application as data;
- over HTTP, the ``peer_metadata`` filter (which istiod names ``istio.metadata_exchange``) reads
  and writes the peer's metadata in headers: upstream on outbound and gateway HCMs, downstream on
  inbound ones.

Which proxies get each is ``extensions``' decision; these only build them. The configurations are
``udpa.type.v1.TypedStruct``s, as istiod writes them (Istio's proxy reads either TypedStruct).
"""

from __future__ import annotations

from typing import Any

from envoy.config.cluster.v3 import filter_pb2
from envoy.config.listener.v3 import listener_components_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from udpa.type.v1 import typed_struct_pb2

from meshpilot.networking import extensions
from meshpilot.networking.protobuf import pack

_TCP_TYPE = "type.googleapis.com/envoy.tcp.metadataexchange.config.MetadataExchange"
_HTTP_TYPE = "type.googleapis.com/io.istio.http.peer_metadata.Config"
PEER_EXCHANGE_ALPN = "istio-peer-exchange"


def _tcp_config() -> Any:
    config = typed_struct_pb2.TypedStruct(type_url=_TCP_TYPE)
    config.value.update({"protocol": PEER_EXCHANGE_ALPN, "enable_discovery": True})
    return pack(config)


def cluster_filter() -> Any:
    """The upstream filter of outbound clusters."""
    return filter_pb2.Filter(name=extensions.METADATA_EXCHANGE, typed_config=_tcp_config())


def listener_filter() -> Any:
    """The network filter first on inbound chains."""
    return listener_components_pb2.Filter(name=extensions.METADATA_EXCHANGE, typed_config=_tcp_config())


def http_filter(*, inbound: bool) -> Any:
    """``peer_metadata``: downstream on inbound HCMs, upstream on outbound and gateway ones."""
    direction = "downstream" if inbound else "upstream"
    config = typed_struct_pb2.TypedStruct(type_url=_HTTP_TYPE)
    config.value.update(
        {
            f"{direction}_discovery": [{"istio_headers": {}}, {"workload_discovery": {}}],
            f"{direction}_propagation": [{"istio_headers": {}}],
        }
    )
    return hcm_pb2.HttpFilter(name=extensions.METADATA_EXCHANGE, typed_config=pack(config))
