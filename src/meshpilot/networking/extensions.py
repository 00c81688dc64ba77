"""Filters only Istio's Envoy build has, and whether a proxy has them.

Envoy lists its extensions in ``node.extensions`` on its first request.
meshpilot emits an Istio-only filter only to proxies that report it, so an
upstream Envoy accepts everything it is sent.
"""

from __future__ import annotations

from meshpilot.model.proxy import Proxy

METADATA_EXCHANGE = "istio.metadata_exchange"
ALPN = "istio.alpn"
STATS = "istio.stats"


def has_metadata_exchange(proxy: Proxy) -> bool:
    return proxy.has_extension(METADATA_EXCHANGE)


def has_alpn_filter(proxy: Proxy) -> bool:
    return proxy.has_extension(ALPN)


def mtls_client_alpn(proxy: Proxy, *, http2: bool) -> list[str]:
    """Client ALPN of in-mesh mTLS: ``istio-peer-exchange`` only with the exchange filter."""
    alpn = ["istio-peer-exchange", "istio"] if has_metadata_exchange(proxy) else ["istio"]
    return [*alpn, "h2"] if http2 else alpn


def mtls_server_tcp_alpn(proxy: Proxy) -> list[str]:
    if has_metadata_exchange(proxy):
        return ["istio-peer-exchange", "h2", "http/1.1"]
    return ["h2", "http/1.1"]
