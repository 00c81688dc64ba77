"""Istio's ``istio.stats`` filters (HTTP and network), from the metrics providers a proxy has.

istiod (``model/telemetry.go``, buildHTTPTelemetryFilter and buildTCPTelemetryFilter) writes one
filter per Prometheus provider in scope (MeshConfig ``defaultProviders.metrics``, ``[prometheus]``
in every Helm install, or the Telemetry API's ``metrics``), with the Telemetry overrides of the
side the listener serves: a metric dropped, tags added or removed, the TCP reporting interval. A
side whose metrics are all disabled gets no filter. Other provider kinds make no filter (logged and
counted in ``meshpilot_telemetry_problems_total``).

Where they go (as ``networking/core`` inserts them): in every HTTP connection manager after cors and
before the router, and on TCP chains right before tcp_proxy (service chains, passthrough and
blackhole chains, inbound and outbound, gateways). Gateways are clients, but, like a sidecar's
inbound side, never fall back to the Host header for the destination service.

Istio's proxy only: ``extensions.has_http_stats`` / ``has_tcp_stats`` decide who gets them. The
filters of one scope, side and protocol are built once per snapshot and shared.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from envoy.config.listener.v3 import listener_components_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)

from meshpilot._proto.istio.envoy.stats import config_pb2 as stats_pb2
from meshpilot.model import telemetry
from meshpilot.model.proxy import NodeType, Proxy
from meshpilot.model.push_context import PushContext
from meshpilot.model.telemetry import ProviderMetrics, TelemetryClass
from meshpilot.networking import extensions
from meshpilot.networking.protobuf import pack
from meshpilot.networking.telemetry_problems import provider_problem

TCP_PROXY = "envoy.filters.network.tcp_proxy"

#: The Prometheus names (after the ``istio_`` prefix) of the predefined metrics.
_PROMETHEUS_NAMES = {
    "REQUEST_COUNT": "requests_total",
    "REQUEST_DURATION": "request_duration_milliseconds",
    "REQUEST_SIZE": "request_bytes",
    "RESPONSE_SIZE": "response_bytes",
    "TCP_OPENED_CONNECTIONS": "tcp_connections_opened_total",
    "TCP_CLOSED_CONNECTIONS": "tcp_connections_closed_total",
    "TCP_SENT_BYTES": "tcp_sent_bytes_total",
    "TCP_RECEIVED_BYTES": "tcp_received_bytes_total",
    "GRPC_REQUEST_MESSAGES": "request_messages_total",
    "GRPC_RESPONSE_MESSAGES": "response_messages_total",
}


def _plugin_config(found: ProviderMetrics, cls: TelemetryClass, gateway: bool) -> Any | None:
    side = found.side(cls)
    if side.disabled:
        return None
    config = stats_pb2.PluginConfig(disable_host_header_fallback=gateway or cls is TelemetryClass.SERVER)
    if found.reporting_interval is not None:
        config.tcp_reporting_duration.CopyFrom(found.reporting_interval)
    for override in side.overrides:
        metric = config.metrics.add(
            name=_PROMETHEUS_NAMES.get(override.name, override.name), drop=override.disabled
        )
        for tag in override.tags:
            if tag.remove:
                metric.tags_to_remove.append(tag.name)
            else:
                metric.dimensions[tag.name] = tag.value
    return pack(config)


def _configs(push: PushContext, proxy: Proxy, cls: TelemetryClass) -> list[Any]:
    gateway = proxy.type is NodeType.ROUTER
    out = []
    for found in telemetry.metrics(push, proxy):
        kind = found.provider.WhichOneof("provider")
        if kind != "prometheus":
            # istiod makes filters for Prometheus providers only: said, as the provider then counts nothing.
            provider_problem(
                found.provider, f"a {kind} metrics provider makes no istio.stats filter (as in istiod)"
            )
            continue
        config = _plugin_config(found, cls, gateway)
        if config is not None:
            out.append(config)
    return out


def http(push: PushContext, proxy: Proxy, cls: TelemetryClass) -> list[Any]:
    """The ``istio.stats`` HTTP filters of one side of ``proxy`` (callers must not change the list)."""
    if not extensions.has_http_stats(proxy):
        return []
    return _filters(push, proxy, cls, hcm_pb2.HttpFilter)


def tcp(push: PushContext, proxy: Proxy, cls: TelemetryClass) -> list[Any]:
    """The ``istio.stats`` network filters of one side of ``proxy`` (callers must not change the list)."""
    if not extensions.has_tcp_stats(proxy):
        return []
    return _filters(push, proxy, cls, listener_components_pb2.Filter)


def _filters(push: PushContext, proxy: Proxy, cls: TelemetryClass, kind: Any) -> list[Any]:
    """``kind`` (an HTTP or a network filter message) of each config: once per snapshot and scope."""
    scope = telemetry.applicable(push, proxy)
    question = ("stats", kind, cls, proxy.type is NodeType.ROUTER)

    def make() -> list[Any]:
        return [kind(name=extensions.STATS, typed_config=config) for config in _configs(push, proxy, cls)]

    found: list[Any] = telemetry.derived(push, scope, question, make)
    return found


def before_tcp_proxy(filters: list[Any], stats: Sequence[Any]) -> list[Any]:
    """``filters`` with ``stats`` right before a trailing tcp_proxy (a chain without one is left alone)."""
    if stats and filters and filters[-1].name == TCP_PROXY:
        filters[-1:-1] = stats
    return filters


def add_to_chain(chain: Any, stats: Sequence[Any]) -> None:
    """Put ``stats`` right before the tcp_proxy that ends ``chain``'s filters, if one does."""
    if stats and chain.filters and chain.filters[-1].name == TCP_PROXY:
        filters = before_tcp_proxy(list(chain.filters), stats)
        del chain.filters[:]
        chain.filters.extend(filters)
