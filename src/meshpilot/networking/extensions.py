"""Filters only Istio's proxy has, and which proxy gets them: the one place that decides.

istiod sends metadata exchange, ``istio.alpn`` and ``istio.stats`` to every proxy without asking,
since it only ever serves Istio's proxy. meshpilot also serves upstream Envoy, which rejects a whole
update naming a filter it lacks. The rule:

- a proxy that lists its extensions (Envoy puts them in ``node.extensions`` on its first request)
  gets an Istio-only filter only when the list has it, under the name Istio's proxy registers it
  (which is not the name the configuration gives the filter);
- a proxy that lists none gets them all if Istio's agent started it (its node metadata carries
  ``ISTIO_VERSION``), as istiod does, and none otherwise.

The registered names are istio/proxy's factory names (its ``source/extensions/filters``), as an
Istio proxy's ``node.extensions`` lists them.
"""

from __future__ import annotations

import enum

from meshpilot.model.proxy import Proxy

#: The names istiod gives the filters in the configuration.
METADATA_EXCHANGE = "istio.metadata_exchange"
ALPN = "istio.alpn"
STATS = "istio.stats"


class IstioFilter(enum.Enum):
    """An Istio-only filter, by the name Istio's proxy registers (and reports) it under."""

    #: The network filter of inbound TCP chains that reads (and strips) the exchange header.
    TCP_METADATA_EXCHANGE = "envoy.filters.network.metadata_exchange"
    #: The cluster (upstream network) filter that sends the exchange header to in-mesh peers.
    UPSTREAM_METADATA_EXCHANGE = "envoy.filters.network.upstream.metadata_exchange"
    #: The HTTP filter exchanging peer metadata in headers (istiod names it istio.metadata_exchange).
    PEER_METADATA = "envoy.filters.http.peer_metadata"
    HTTP_STATS = "envoy.filters.http.istio_stats"
    TCP_STATS = "envoy.filters.network.istio_stats"
    ALPN = "istio.alpn"


def is_istio_proxy(proxy: Proxy) -> bool:
    """Started by Istio's agent, which always sends its version in the node metadata."""
    return bool(proxy.metadata.istio_version)


def supports(proxy: Proxy, istio_filter: IstioFilter) -> bool:
    if proxy.extensions:
        return istio_filter.value in proxy.extensions
    return is_istio_proxy(proxy)


def has_tcp_metadata_exchange(proxy: Proxy) -> bool:
    return supports(proxy, IstioFilter.TCP_METADATA_EXCHANGE)


def has_upstream_metadata_exchange(proxy: Proxy) -> bool:
    return supports(proxy, IstioFilter.UPSTREAM_METADATA_EXCHANGE)


def has_peer_metadata(proxy: Proxy) -> bool:
    return supports(proxy, IstioFilter.PEER_METADATA)


def has_alpn_filter(proxy: Proxy) -> bool:
    return supports(proxy, IstioFilter.ALPN)


def has_http_stats(proxy: Proxy) -> bool:
    return supports(proxy, IstioFilter.HTTP_STATS)


def has_tcp_stats(proxy: Proxy) -> bool:
    return supports(proxy, IstioFilter.TCP_STATS)


def mtls_client_alpn(proxy: Proxy, *, http2: bool) -> list[str]:
    """Client ALPN of in-mesh mTLS: ``istio-peer-exchange`` only when the cluster sends the exchange."""
    alpn = ["istio-peer-exchange", "istio"] if has_upstream_metadata_exchange(proxy) else ["istio"]
    return [*alpn, "h2"] if http2 else alpn


def mtls_server_tcp_alpn(proxy: Proxy) -> list[str]:
    """Server ALPN of an inbound TCP chain: ``istio-peer-exchange`` only when the chain starts with
    the exchange filter, which strips the header before the application's bytes."""
    if has_tcp_metadata_exchange(proxy):
        return ["istio-peer-exchange", "h2", "http/1.1"]
    return ["h2", "http/1.1"]
