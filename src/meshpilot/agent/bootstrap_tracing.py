"""The tracer of the legacy ProxyConfig ``tracing`` section, in Envoy's bootstrap as pilot-agent puts it.

With MeshConfig ``enableTracing`` and no Telemetry provider, the control plane gives each HTTP connection
manager sampling and tags but no tracer: the tracer is the bootstrap's ``tracing.http``, which the agent
writes from the proxy's ``tracing`` (its PROXY_CONFIG, or the mesh's ``defaultConfig``), with a static
cluster to the collector. This module says what goes in, following pilot-agent's bootstrap template:

- ``zipkin``: ``envoy.tracers.zipkin`` (``/api/v2/spans``, JSON, 128-bit trace IDs, no shared span
  context) sending to the ``zipkin`` cluster;
- ``datadog``: ``envoy.tracers.datadog`` sending to ``datadog_agent``, the service named after the node's
  cluster (``app.namespace``);
- ``tlsSettings``: the collector cluster's TLS, its certificates from the agent's SDS (mounted files as
  ``file-cert:`` / ``file-root:``, or the workload's own with ``ISTIO_MUTUAL``, SNI ``tracer`` unless
  set); ``ISTIO_META_TLS_CLIENT_*`` paths win over the settings' files, as with pilot-agent.

``$(HOST_IP)`` in a collector address is the node's address (``HOST_IP``), for a collector run as a
DaemonSet. The other legacy tracers are not in the Envoy meshpilot's proxies run: ``lightstep`` (removed
from Envoy; pilot-agent writes it and its Envoy then refuses to start) and ``stackdriver`` (pilot-agent
refuses it off Google Cloud and writes no tracer on it) stop the agent with the reason;
``openCensusAgent``, for which pilot-agent writes nothing, is logged and counted
(``meshpilot_agent_unapplied_proxy_config``), as are TLS fields pilot-agent does not use for the tracer.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import Gauge

from meshpilot._proto.istio.mesh.v1alpha1 import proxy_pb2
from meshpilot._proto.istio.networking.v1alpha3 import destination_rule_pb2
from meshpilot.agent.settings import SettingsError
from meshpilot.config.validation import goparse

log = logging.getLogger(__name__)

ZIPKIN_CONFIG = "type.googleapis.com/envoy.config.trace.v3.ZipkinConfig"
DATADOG_CONFIG = "type.googleapis.com/envoy.config.trace.v3.DatadogConfig"
UPSTREAM_TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
#: The SNI pilot-agent sends to an ISTIO_MUTUAL collector that names none.
ISTIO_MUTUAL_SNI = "tracer"
_TLS = destination_rule_pb2.ClientTLSSettings

UNAPPLIED = Gauge(
    "meshpilot_agent_unapplied_proxy_config",
    "ProxyConfig fields the agent accepts but does not apply (meshpilot only), by field.",
    ["field"],
)


@dataclass(frozen=True, slots=True)
class BootstrapTracer:
    """The bootstrap's ``tracing`` section and the static cluster its tracer sends to."""

    tracing: dict[str, Any]
    cluster: dict[str, Any]


def _unapplied(field: str, why: str) -> None:
    log.warning("ProxyConfig %s is not applied: %s", field, why)
    UNAPPLIED.labels(field).set(1)


def _socket_address(address: str, environ: Mapping[str, str]) -> dict[str, Any]:
    """``host:port`` (checked when the settings were read) as a socket address."""
    host, port = goparse.split_host_port(address)
    if host == "$(HOST_IP)" and environ.get("HOST_IP"):
        host = environ["HOST_IP"]
    return {"address": host, "port_value": int(port)}


def _sds(name: str, *, agent_secret: bool) -> dict[str, Any]:
    """A secret from the agent's SDS; the workload's own (``default``, ``ROOTCA``) do not hold Envoy's
    start-up, as pilot-agent's shared configs set it."""
    source: dict[str, Any] = {
        "api_config_source": {
            "api_type": "GRPC",
            "grpc_services": [{"envoy_grpc": {"cluster_name": "sds-grpc"}}],
            "set_node_on_first_message_only": True,
            "transport_api_version": "V3",
        },
        "resource_api_version": "V3",
    }
    if agent_secret:
        source["initial_fetch_timeout"] = "0s"
    return {"name": name, "sds_config": source}


def _transport_socket(tls: Any, metadata: Mapping[str, Any]) -> dict[str, Any] | None:
    """The collector cluster's TLS (pilot-agent's ``tlsContextConvert`` for the tracer); None without."""
    # Verification is never skipped: insecureSkipVerify is left out with the others.
    for name, present in (
        ("credentialName", bool(tls.credential_name)),
        ("caCrl", bool(tls.ca_crl)),
        ("insecureSkipVerify", tls.insecure_skip_verify.value),
    ):
        if present:
            _unapplied(f"tracing.tlsSettings.{name}", "pilot-agent does not use it for the tracer's TLS")
    certificates: list[dict[str, Any]] = []
    if tls.mode == _TLS.ISTIO_MUTUAL:
        certificates.append(_sds("default", agent_secret=True))
        root = _sds("ROOTCA", agent_secret=True)
        sni = tls.sni or ISTIO_MUTUAL_SNI
    elif tls.mode in (_TLS.SIMPLE, _TLS.MUTUAL):
        ca = str(metadata.get("TLS_CLIENT_ROOT_CERT") or tls.ca_certificates)
        if not ca:
            # Envoy refuses a validation context without roots: the proxy would not start.
            raise SettingsError(
                f"ProxyConfig tracing.tlsSettings mode {_TLS.TLSmode.Name(tls.mode)} names no "
                "caCertificates (nor ISTIO_META_TLS_CLIENT_ROOT_CERT) to verify the collector with"
            )
        if tls.mode == _TLS.MUTUAL:
            chain = str(metadata.get("TLS_CLIENT_CERT_CHAIN") or tls.client_certificate)
            key = str(metadata.get("TLS_CLIENT_KEY") or tls.private_key)
            if chain and key:
                certificates.append(_sds(f"file-cert:{chain}~{key}", agent_secret=False))
        root = _sds(f"file-root:{ca}", agent_secret=False)
        sni = tls.sni
    else:
        return None
    sans = [{"exact": name} for name in tls.subject_alt_names]
    common: dict[str, Any] = {
        "combined_validation_context": {
            "default_validation_context": {"match_subject_alt_names": sans} if sans else {},
            "validation_context_sds_secret_config": root,
        }
    }
    if certificates:
        common["tls_certificate_sds_secret_configs"] = certificates
    # No ALPN: zipkin and datadog collectors are HTTP/1.1.
    context: dict[str, Any] = {"@type": UPSTREAM_TLS, "common_tls_context": common}
    if sni:
        context["sni"] = sni
    return {"name": "envoy.transport_sockets.tls", "typed_config": context}


def _cluster(
    name: str,
    address: dict[str, Any],
    dns_lookup_family: str,
    transport_socket: dict[str, Any] | None,
    *,
    refresh: bool,
) -> dict[str, Any]:
    cluster: dict[str, Any] = {"name": name, "alt_stat_name": f"{name};"}
    if transport_socket is not None:
        cluster["transport_socket"] = transport_socket
    cluster.update(type="STRICT_DNS", respect_dns_ttl=True, dns_lookup_family=dns_lookup_family)
    # The template re-resolves the zipkin collector every 30s; datadog's keeps Envoy's default.
    if refresh:
        cluster["dns_refresh_rate"] = "30s"
    cluster.update(connect_timeout="1s", lb_policy="ROUND_ROBIN")
    cluster["load_assignment"] = {
        "cluster_name": name,
        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": address}}}]}],
    }
    return cluster


def bootstrap_tracer(
    tracing: proxy_pb2.Tracing | None,
    *,
    metadata: Mapping[str, Any],
    environ: Mapping[str, str],
    service_cluster: str,
    dns_lookup_family: str,
) -> BootstrapTracer | None:
    """The tracer for the proxy config's ``tracing`` (checked by ``settings.proxy_tracing``); None when
    it names none Envoy can run. Raises SettingsError for one the proxy could not start with."""
    kind = tracing.WhichOneof("tracer") if tracing is not None else None
    if tracing is None or kind is None:
        return None
    if kind == "lightstep":
        raise SettingsError(
            "ProxyConfig tracing.lightstep: Envoy no longer has the Lightstep tracer (pilot-agent writes "
            "it and its Envoy refuses to start); send spans with an opentelemetry provider instead"
        )
    if kind == "stackdriver":
        raise SettingsError(
            "ProxyConfig tracing.stackdriver: Envoy has no Stackdriver tracer (pilot-agent refuses it "
            "outside Google Cloud and writes none on it); use an opentelemetry provider instead"
        )
    if kind == "open_census_agent":
        _unapplied("tracing.openCensusAgent", "Envoy has no OpenCensus tracer and pilot-agent writes none")
        return None
    socket = _transport_socket(tracing.tls_settings, metadata) if tracing.HasField("tls_settings") else None
    if kind == "zipkin":
        config: dict[str, Any] = {
            "@type": ZIPKIN_CONFIG,
            "collector_cluster": "zipkin",
            "collector_endpoint": "/api/v2/spans",
            "collector_endpoint_version": "HTTP_JSON",
            "trace_id_128bit": True,
            "shared_span_context": False,
        }
        address = _socket_address(tracing.zipkin.address, environ)
        cluster = _cluster("zipkin", address, dns_lookup_family, socket, refresh=True)
        name = "envoy.tracers.zipkin"
    else:
        config = {
            "@type": DATADOG_CONFIG,
            "collector_cluster": "datadog_agent",
            "service_name": service_cluster,
        }
        address = _socket_address(tracing.datadog.address, environ)
        cluster = _cluster("datadog_agent", address, dns_lookup_family, socket, refresh=False)
        name = "envoy.tracers.datadog"
    return BootstrapTracer({"http": {"name": name, "typed_config": config}}, cluster)
