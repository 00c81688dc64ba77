"""Envoy's bootstrap, in the shape pilot-agent writes to ``<configPath>/envoy-rev.json``.

Built as data, field by field, for the inputs an injected sidecar has: the node (ID, cluster, locality,
metadata), the stats tags and inclusion list, the admin listener on ``proxyAdminPort``, ADS over the
``xds-grpc`` cluster (the agent's XDS Unix socket; ``DELTA_GRPC`` unless ``ISTIO_DELTA_XDS=false``), SDS
over ``sds-grpc`` (``./var/run/secrets/workload-spiffe-uds/socket``), the ``agent`` cluster to the status
port, the Prometheus listener (``ENVOY_PROMETHEUS_PORT``, 15090) and the readiness listener
(``ENVOY_STATUS_PORT``, 15021), a global runtime layer, and the tracer of the ProxyConfig's legacy
``tracing`` section (zipkin or datadog, with the static cluster to its collector; see
``bootstrap_tracing.py``). What pilot-agent's template adds for inputs meshpilot does not take yet
(metrics and access-log services, statsd, secure metrics ports, self-discovery, a custom bootstrap
template) is left out; ``tests/agent/test_agent_bootstrap.py`` compares the result with the real
agent's file, with and without a tracer.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from meshpilot.agent.bootstrap_tracing import bootstrap_tracer
from meshpilot.agent.settings import (
    WORKLOAD_SOCKET_DIR,
    AgentSettings,
    node_locality,
    node_metadata,
    proxy_tracing,
    service_cluster,
)

log = logging.getLogger(__name__)

BOOTSTRAP_FILE = "envoy-rev.json"
HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
HTTP_OPTIONS = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
TYPED_STRUCT = "type.googleapis.com/udpa.type.v1.TypedStruct"
INTERNAL_LISTENER = "type.googleapis.com/envoy.extensions.bootstrap.internal_listener.v3.InternalListener"
DOWNSTREAM_CONNECTIONS = (
    "type.googleapis.com/envoy.extensions.resource_monitors.downstream_connections.v3."
    "DownstreamConnectionsConfig"
)

#: Stats prefixes, suffixes and regexes pilot-agent always keeps (``pkg/bootstrap/config.go``).
REQUIRED_PREFIXES = ("cluster_manager", "listener_manager", "server", "cluster.xds-grpc", "wasm")
RBAC_SUFFIXES = ("rbac.allowed", "rbac.denied", "shadow_allowed", "shadow_denied")
REQUIRED_REGEXES = (r"vhost\..*\.route\..*",)
EXTRA_STAT_TAGS_ANNOTATION = "sidecar.istio.io/extraStatTags"
PREFIXES_ANNOTATION = "sidecar.istio.io/statsInclusionPrefixes"
SUFFIXES_ANNOTATION = "sidecar.istio.io/statsInclusionSuffixes"
REGEXES_ANNOTATION = "sidecar.istio.io/statsInclusionRegexps"
BUCKETS_ANNOTATION = "sidecar.istio.io/statsHistogramBuckets"

#: Envoy's default tag extractors that Istio keeps, then its own; (tag, regex) in the template's order.
STATS_TAGS_HEAD = (
    ("cluster_name", r"^cluster(\.(.+);)"),
    ("http_conn_manager_prefix", r"^http\.(((?:[_.[:digit:]\w]*|[_\[\]aAbBcCdDeEfF[:digit:]\w\:]*));\.)"),
    ("thread_name", r"^server(\.(.+))\.watchdog"),
    ("tcp_prefix", r"^tcp\.((.*?)\.)\w+?$"),
    ("response_code", r"_rq(_(\d{3}))$"),
    ("response_code_class", r"_rq(_(\dxx))$"),
    (
        "http_conn_manager_listener_prefix",
        r"^listener(?=\.).*?\.http\.(((?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*))\.)",
    ),
    ("listener_address", r"^listener\.(((?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*))\.)"),
    ("mongo_prefix", r"^mongo\.(.+?)\.(collection|cmd|cx_|op_|delays_|decoding_)(.*?)$"),
)
STATS_TAGS_TAIL = (
    ("cache", r"(cache\.(.+?)\.)"),
    ("component", r"(component\.(.+?)\.)"),
    ("tag", r"(tag\.(.+?);\.)"),
    ("wasm_filter", r"(wasm_filter\.(.+?)\.)"),
    ("authz_enforce_result", r"rbac(\.(allowed|denied))"),
    ("authz_dry_run_action", r"(\.istio_dry_run_(allow|deny)_)"),
    ("authz_dry_run_result", r"(\.shadow_(allowed|denied))"),
)
#: pilot-agent's runtime defaults (``extractRuntimeFlags``); ProxyConfig ``runtimeValues`` override them.
RUNTIME_DEFAULTS: Mapping[str, Any] = {
    "re2.max_program_size.error_level": "32768",
    "envoy.deprecated_features:envoy.config.listener.v3.Listener."
    "hidden_envoy_deprecated_use_original_dst": True,
    "envoy.reloadable_features.http_reject_path_with_fragment": False,
    "envoy.reloadable_features.fixed_heap_use_allocated": True,
    "envoy.reloadable_features.coalesce_lb_rebuilds_on_batch_update": False,
}
#: Content types the stats listener compresses.
STATS_CONTENT_TYPES = (
    "text/plain",
    "application/vnd.google.protobuf",
    "application/openmetrics-text",
    "application/openmetrics-protobuf",
)
COMPRESSORS = (
    ("brotli", "type.googleapis.com/envoy.extensions.compression.brotli.compressor.v3.Brotli"),
    ("zstd", "type.googleapis.com/envoy.extensions.compression.zstd.compressor.v3.Zstd"),
    ("gzip", "type.googleapis.com/envoy.extensions.compression.gzip.compressor.v3.Gzip"),
)
MAX_CONNECTIONS = 2147483647
H2_OPTIONS = {
    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
        "@type": HTTP_OPTIONS,
        "explicit_http_config": {"http2_protocol_options": {}},
    }
}


def _ipv6_only(ips: Iterable[str]) -> bool:
    """Every address IPv6: pilot-agent (without dual stack) then binds and resolves IPv6 only."""
    return all(ipaddress.ip_address(ip).version == 6 for ip in ips)


def _addresses(ips: Iterable[str]) -> tuple[str, str]:
    """(localhost, wildcard) for the pod's addresses."""
    return ("::1", "::") if _ipv6_only(ips) else ("127.0.0.1", "0.0.0.0")


def _split(text: str) -> list[str]:
    return [item for item in text.split(",") if item]


def _inclusion(
    annotation: str, configured: list[str] | None, required: Iterable[str], ips: Iterable[str]
) -> list[str]:
    """An annotation's list, else the ProxyConfig's, then the required ones; ``{pod_ip}`` expanded."""
    items = _split(annotation) if annotation else list(configured or [])
    items += list(required)
    out: list[str] = []
    for item in items:
        out += [item.replace("{pod_ip}", ip) for ip in ips] if "{pod_ip}" in item else [item]
    return out


def stats_config(settings: AgentSettings, metadata: Mapping[str, Any]) -> dict[str, Any]:
    annotations: Mapping[str, str] = metadata.get("ANNOTATIONS") or {}
    config = settings.proxy_config
    ips = list(dict.fromkeys(settings.ip_addresses))
    extra_tags = list(
        dict.fromkeys(
            [t for t in config.get("extraStatTags") or [] if t]
            + _split(annotations.get(EXTRA_STAT_TAGS_ANNOTATION, ""))
        )
    )
    tags = [{"tag_name": name, "regex": regex} for name, regex in STATS_TAGS_HEAD]
    tags += [{"regex": f"({tag}=\\.=(.*?);\\.;)", "tag_name": tag} for tag in extra_tags]
    tags += [{"regex": regex, "tag_name": name} for name, regex in STATS_TAGS_TAIL]
    matcher = config.get("proxyStatsMatcher") or {}
    suffixes = list(RBAC_SUFFIXES)
    if metadata.get("EXIT_ON_ZERO_ACTIVE_CONNECTIONS") == "true":
        suffixes.append("downstream_cx_active")
    patterns: list[dict[str, Any]] = [{"prefix": "reporter="}]
    if metadata.get("METADATA_DISCOVERY") == "true":
        patterns.append({"prefix": "workload_discovery"})
    patterns += [
        {"prefix": p}
        for p in _inclusion(
            annotations.get(PREFIXES_ANNOTATION, ""), matcher.get("inclusionPrefixes"), REQUIRED_PREFIXES, ips
        )
    ]
    patterns += [
        {"suffix": s}
        for s in _inclusion(
            annotations.get(SUFFIXES_ANNOTATION, ""), matcher.get("inclusionSuffixes"), suffixes, ips
        )
    ]
    patterns += [
        {"safe_regex": {"regex": r}}
        for r in _inclusion(
            annotations.get(REGEXES_ANNOTATION, ""), matcher.get("inclusionRegexps"), REQUIRED_REGEXES, ips
        )
    ]
    patterns += [{"prefix": "component"}, {"prefix": "istio"}]
    out: dict[str, Any] = {"use_all_default_tags": False, "stats_tags": tags}
    buckets_text = annotations.get(BUCKETS_ANNOTATION)
    if buckets_text:
        try:
            buckets = json.loads(buckets_text)
            out["histogram_bucket_settings"] = [
                {"match": {"prefix": prefix}, "buckets": buckets[prefix]} for prefix in sorted(buckets)
            ]
        except (ValueError, TypeError) as err:
            log.warning("ignoring %s: %s", BUCKETS_ANNOTATION, err)
    out["stats_matcher"] = {"inclusion_list": {"patterns": patterns}}
    return out


def runtime_flags(settings: AgentSettings) -> dict[str, Any]:
    flags = dict(RUNTIME_DEFAULTS)
    for key, value in (settings.proxy_config.get("runtimeValues") or {}).items():
        if value == "":
            flags.pop(key, None)
        else:
            flags[key] = {"true": True, "false": False}.get(value, value)
    return flags


def _static_cluster(name: str, address: dict[str, Any], connect_timeout: str) -> dict[str, Any]:
    return {
        "name": name,
        "alt_stat_name": f"{name};",
        "type": "STATIC",
        "connect_timeout": connect_timeout,
        "lb_policy": "ROUND_ROBIN",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address}}]}],
        },
    }


def _tcp(address: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"protocol": "TCP", "address": address, "port_value": port}}


def clusters(settings: AgentSettings, localhost: str, socket_file: str) -> list[dict[str, Any]]:
    """The template's static clusters, before any for a tracer."""
    prometheus = _static_cluster("prometheus_stats", _tcp(localhost, settings.admin_port), "0.250s")
    agent = _static_cluster("agent", _tcp(localhost, settings.status_port), "0.250s")
    sds_path = f"./{WORKLOAD_SOCKET_DIR}/{socket_file}"
    sds = _static_cluster("sds-grpc", {"pipe": {"path": sds_path}}, "1s")
    sds["typed_extension_protocol_options"] = H2_OPTIONS
    # The configPath as written (``./etc/istio/proxy``), not normalized, as the template prints it.
    xds_path = f"{str(settings.proxy_config['configPath']).rstrip('/')}/XDS"
    xds = _static_cluster("xds-grpc", {"pipe": {"path": xds_path}}, "1s")
    limits = {"max_connections": 100000, "max_pending_requests": 100000, "max_requests": 100000}
    xds["circuit_breakers"] = {"thresholds": [{"priority": p, **limits} for p in ("DEFAULT", "HIGH")]}
    xds["upstream_connection_options"] = {"tcp_keepalive": {"keepalive_time": 300}}
    xds["max_requests_per_connection"] = 1
    xds["typed_extension_protocol_options"] = H2_OPTIONS
    return [prometheus, agent, sds, xds]


def _http_listener(
    address: str, port: int, stat_prefix: str, routes: list[tuple[str, str]], filters: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "name": f"{address}_{port}",
        "address": _tcp(address, port),
        "ignore_global_conn_limit": True,
        "bypass_overload_manager": True,
        "filter_chains": [
            {
                "filters": [
                    {
                        "name": "envoy.filters.network.http_connection_manager",
                        "typed_config": {
                            "@type": HCM,
                            "codec_type": "AUTO",
                            "stat_prefix": stat_prefix,
                            "route_config": {
                                "virtual_hosts": [
                                    {
                                        "name": "backend",
                                        "domains": ["*"],
                                        "routes": [
                                            {"match": {"prefix": prefix}, "route": {"cluster": cluster}}
                                            for prefix, cluster in routes
                                        ],
                                    }
                                ]
                            },
                            "http_filters": [
                                *filters,
                                {"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}},
                            ],
                        },
                    }
                ]
            }
        ],
    }


def _compressor(name: str, library: str) -> dict[str, Any]:
    return {
        "name": f"envoy.filters.http.compressor.{name}",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.compressor.v3.Compressor",
            "compressor_library": {"name": f"stats_{name}", "typed_config": {"@type": library}},
            "response_direction_config": {"common_config": {"content_type": list(STATS_CONTENT_TYPES)}},
        },
    }


def listeners(settings: AgentSettings, localhost: str, wildcard: str) -> list[dict[str, Any]]:
    metadata_proxy = settings.proxy_config.get("proxyMetadata") or {}
    prometheus_address = (
        localhost if metadata_proxy.get("METRICS_LOCALHOST_ACCESS_ONLY") == "true" else wildcard
    )
    compression = settings.proxy_config.get("statsCompression", True)
    compressors = [_compressor(n, lib) for n, lib in COMPRESSORS] if compression is not False else []
    prometheus = _http_listener(
        prometheus_address,
        settings.envoy_prometheus_port,
        "stats",
        [("/stats/prometheus", "prometheus_stats")],
        compressors,
    )
    status = _http_listener(wildcard, settings.envoy_status_port, "agent", [("/healthz/ready", "agent")], [])
    return [prometheus, status]


def build_bootstrap(settings: AgentSettings) -> dict[str, Any]:
    """The bootstrap for ``settings``, as JSON-ready data; raises SettingsError for a tracer the proxy
    could not start with."""
    metadata = node_metadata(settings)
    localhost, wildcard = _addresses(settings.ip_addresses)
    cluster = service_cluster(settings, metadata)
    tracer = bootstrap_tracer(
        proxy_tracing(settings.proxy_config),
        metadata=metadata,
        environ=settings.environ,
        service_cluster=cluster,
        dns_lookup_family="V6_ONLY" if _ipv6_only(settings.ip_addresses) else "V4_ONLY",
    )
    static_clusters = clusters(settings, localhost, str(metadata["WORKLOAD_IDENTITY_SOCKET_FILE"]))
    if tracer is not None:
        static_clusters.append(tracer.cluster)
    ads = {"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"}
    bootstrap: dict[str, Any] = {
        "application_log_config": {
            "log_format": {"text_format": "%Y-%m-%dT%T.%fZ\t%l\tenvoy %n %g:%#\t%v\tthread=%t"}
        },
        "node": {
            "id": settings.node_id,
            "cluster": cluster,
            "locality": node_locality(metadata),
            "metadata": metadata,
        },
        "layered_runtime": {
            "layers": [
                {"name": "global config", "static_layer": runtime_flags(settings)},
                {"name": "admin", "admin_layer": {}},
            ]
        },
        "bootstrap_extensions": [
            {
                "name": "envoy.bootstrap.internal_listener",
                "typed_config": {
                    "@type": TYPED_STRUCT,
                    "type_url": INTERNAL_LISTENER,
                    "value": {"buffer_size_kb": 64},
                },
            }
        ],
        "stats_config": stats_config(settings, metadata),
        "admin": {
            "access_log": [
                {
                    "name": "envoy.access_loggers.file",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                        "path": "/dev/null",
                    },
                }
            ],
            "profile_path": "/var/lib/istio/data/envoy.prof",
            "address": {"socket_address": {"address": localhost, "port_value": settings.admin_port}},
        },
        "dynamic_resources": {
            "lds_config": dict(ads),
            "cds_config": dict(ads),
            "ads_config": {
                "api_type": "DELTA_GRPC" if settings.delta_xds else "GRPC",
                "set_node_on_first_message_only": True,
                "transport_api_version": "V3",
                "grpc_services": [{"envoy_grpc": {"cluster_name": "xds-grpc"}}],
            },
        },
        "static_resources": {
            "clusters": static_clusters,
            "listeners": listeners(settings, localhost, wildcard),
        },
        "overload_manager": {
            "resource_monitors": [
                {
                    "name": "envoy.resource_monitors.global_downstream_max_connections",
                    "typed_config": {
                        "@type": DOWNSTREAM_CONNECTIONS,
                        "max_active_downstream_connections": _max_connections(settings),
                    },
                }
            ]
        },
        "deferred_stat_options": {"enable_deferred_creation_stats": True},
    }
    if tracer is not None:
        bootstrap["tracing"] = tracer.tracing
    return bootstrap


def _max_connections(settings: AgentSettings) -> int:
    """``ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS`` in proxyMetadata, else the (deprecated) runtime
    value ``overload.global_downstream_max_connections``, else no limit."""
    config = settings.proxy_config
    for value in (
        (config.get("proxyMetadata") or {}).get("ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS"),
        (config.get("runtimeValues") or {}).get("overload.global_downstream_max_connections"),
    ):
        try:
            return int(str(value))
        except (TypeError, ValueError):
            continue
    return MAX_CONNECTIONS


def write_bootstrap(settings: AgentSettings) -> Path:
    """Write ``<configPath>/envoy-rev.json`` under the working directory; returns its pod-relative path,
    which is what Envoy (started in the working directory) is given."""
    relative = settings.config_path / BOOTSTRAP_FILE
    target = settings.path(relative)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_suffix(".tmp")
    temporary.write_text(json.dumps(build_bootstrap(settings), indent=2) + "\n")
    temporary.replace(target)
    return relative
