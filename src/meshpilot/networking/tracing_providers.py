"""The tracer a MeshConfig extension provider configures in an HCM's tracing block: Zipkin, Datadog,
SkyWalking and OpenTelemetry (with the Dynatrace sampler), each with its collector cluster found
as istiod finds it; a provider meshpilot cannot build raises ``Unbuilt`` with the reason.
(``tracing.py`` adds sampling and tags and decides which provider a proxy's HCMs get.)
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from typing import Any

from envoy.config.core.v3 import base_pb2, extension_pb2, grpc_service_pb2, http_service_pb2, http_uri_pb2
from envoy.config.trace.v3 import datadog_pb2, opentelemetry_pb2, skywalking_pb2, zipkin_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.tracers.opentelemetry.resource_detectors.v3 import (
    dynatrace_resource_detector_pb2,
    environment_resource_detector_pb2,
)
from envoy.extensions.tracers.opentelemetry.samplers.v3 import dynatrace_sampler_pb2

from meshpilot.model.mesh import MeshConfig
from meshpilot.model.push_context import PushContext
from meshpilot.networking.ext_authz import lookup_cluster
from meshpilot.networking.protobuf import pack
from meshpilot.networking.telemetry_problems import provider_problem

ZIPKIN = "envoy.tracers.zipkin"
DATADOG = "envoy.tracers.datadog"
OPENTELEMETRY = "envoy.tracers.opentelemetry"
SKYWALKING = "envoy.tracers.skywalking"

_Provider = MeshConfig.ExtensionProvider
_ENVIRONMENT_DETECTOR = "envoy.tracers.opentelemetry.resource_detectors.environment"
_DYNATRACE_DETECTOR = "envoy.tracers.opentelemetry.resource_detectors.dynatrace"
_DYNATRACE_SAMPLER = "envoy.tracers.opentelemetry.samplers.dynatrace"


@dataclass(frozen=True, slots=True)
class ProxyInputs:
    """Everything of a proxy a tracing block reads; equal inputs give equal blocks. Fields the
    block being built does not read are left empty (``_inputs``)."""

    router: bool
    canonical_service: str
    canonical_revision: str
    mesh_id: str
    namespace: str
    cluster_id: str
    node_cluster: str
    version: tuple[int, int, int]
    #: The proxy config's ``tracing`` as JSON (its PROXY_CONFIG, else MeshConfig's defaultConfig).
    proxy_tracing: str
    #: What OpenTelemetry's semantic-convention service name reads (istiod's otelServiceName).
    otel_service_name: str


class Unbuilt(Exception):
    """A provider that cannot be configured; the message says why."""


def _cluster(push: PushContext, service: str, port: int) -> tuple[str, str]:
    found = lookup_cluster(push, service, port)
    if isinstance(found, str):
        raise Unbuilt(f"could not find cluster for tracing provider: {found}")
    return found


def _headers(headers: Any) -> list[Any]:
    out = []
    for header in headers:
        option = base_pb2.HeaderValueOption(
            append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
        )
        option.header.key = header.name
        option.header.value = _header_value(header)
        out.append(option)
    return out


def _header_value(header: Any) -> str:
    if header.WhichOneof("header_value") == "env_name":
        return os.environ.get(header.env_name, "")
    return str(header.value)


def _zipkin(push: PushContext, provider: Any, inputs: ProxyInputs) -> Any:
    settings = provider.zipkin
    hostname, cluster = _cluster(push, settings.service, settings.port)
    path = settings.path or "/api/v2/spans"
    config = zipkin_pb2.ZipkinConfig(
        collector_endpoint_version=zipkin_pb2.ZipkinConfig.HTTP_JSON,
        trace_id_128bit=not settings.enable_64bit_trace_id,
    )
    config.shared_span_context.value = False
    if inputs.version >= (1, 29, 0):
        # The HTTP service form, which carries a timeout (Envoy needs one) and headers.
        uri = config.collector_service.http_uri
        uri.uri = f"http://{hostname}{path}"
        uri.cluster = cluster
        if settings.HasField("timeout"):
            uri.timeout.CopyFrom(settings.timeout)
        else:
            uri.timeout.FromSeconds(5)
        config.collector_service.request_headers_to_add.extend(_headers(settings.headers))
    else:
        config.collector_cluster = cluster
        config.collector_endpoint = path
        config.collector_hostname = hostname
        if settings.HasField("timeout") or settings.headers:
            # As istiod: the collector form older proxies read carries neither.
            provider_problem(
                provider, "zipkin timeout and headers need an Istio 1.29 proxy; left out for older ones"
            )
    if inputs.version >= (1, 28, 0):
        with_w3c = _Provider.ZipkinTracingProvider.USE_B3_WITH_W3C_PROPAGATION
        config.trace_context_option = (
            zipkin_pb2.ZipkinConfig.USE_B3_WITH_W3C_PROPAGATION
            if settings.trace_context_option == with_w3c
            else zipkin_pb2.ZipkinConfig.USE_B3
        )
    return config


def _datadog(push: PushContext, settings: Any, inputs: ProxyInputs) -> Any:
    hostname, cluster = _cluster(push, settings.service, settings.port)
    return datadog_pb2.DatadogConfig(
        collector_cluster=cluster, service_name=inputs.node_cluster, collector_hostname=hostname
    )


def _skywalking(push: PushContext, settings: Any) -> Any:
    hostname, cluster = _cluster(push, settings.service, settings.port)
    config = skywalking_pb2.SkyWalkingConfig()
    config.grpc_service.envoy_grpc.cluster_name = cluster
    config.grpc_service.envoy_grpc.authority = hostname
    return config


def _join_url(base: str, path: str) -> str:
    """Go's url.JoinPath of a host and a path: one slash between, the path cleaned."""
    joined = posixpath.normpath(f"{base}/{path}")
    return joined + "/" if path.endswith("/") and joined != base else joined


def _dynatrace_sampler(push: PushContext, settings: Any, hostname: str, cluster: str) -> Any:
    """The Dynatrace sampler: its own API service, else the one the OTLP/HTTP exporter reaches."""
    sampler = settings.dynatrace_sampler
    config = dynatrace_sampler_pb2.DynatraceSamplerConfig(
        tenant=sampler.tenant,
        cluster_id=sampler.cluster_id,
        root_spans_per_minute=sampler.root_spans_per_minute,
    )
    if sampler.HasField("http_service"):
        api = sampler.http_service
        api_host, api_cluster = _cluster(push, api.service, api.port)
        http, uri = api.http, _join_url(api_host, api.http.path)
    elif settings.HasField("http"):
        api_cluster, http = cluster, settings.http
        uri = _join_url(hostname, "api/v2/samplingConfiguration")
    else:
        raise Unbuilt("the Dynatrace sampler has no HTTP service and the exporter is not OTLP/HTTP")
    service = config.http_service
    service.http_uri.uri = uri
    service.http_uri.cluster = api_cluster
    if http.HasField("timeout"):
        service.http_uri.timeout.CopyFrom(http.timeout)
    service.request_headers_to_add.extend(_headers(http.headers))
    return extension_pb2.TypedExtensionConfig(name=_DYNATRACE_SAMPLER, typed_config=pack(config))


def _opentelemetry(push: PushContext, settings: Any, inputs: ProxyInputs) -> Any:
    hostname, cluster = _cluster(push, settings.service, settings.port)
    semantic = settings.service_attribute_enrichment == _Provider.OTEL_SEMANTIC_CONVENTIONS
    config = opentelemetry_pb2.OpenTelemetryConfig(
        service_name=inputs.otel_service_name if semantic else inputs.node_cluster
    )
    if settings.HasField("http"):
        http = settings.http
        service = http_service_pb2.HttpService(
            http_uri=http_uri_pb2.HttpUri(uri=_join_url(hostname, http.path), cluster=cluster)
        )
        if http.HasField("timeout"):
            service.http_uri.timeout.CopyFrom(http.timeout)
        service.request_headers_to_add.extend(_headers(http.headers))
        config.http_service.CopyFrom(service)
    else:
        grpc = grpc_service_pb2.GrpcService()
        grpc.envoy_grpc.cluster_name = cluster
        grpc.envoy_grpc.authority = hostname
        if settings.grpc.HasField("timeout"):
            grpc.timeout.CopyFrom(settings.grpc.timeout)
        for header in settings.grpc.initial_metadata:
            grpc.initial_metadata.add(key=header.name, value=_header_value(header))
        config.grpc_service.CopyFrom(grpc)
    detectors = settings.resource_detectors
    names = []
    if detectors.HasField("environment"):
        names.append(_ENVIRONMENT_DETECTOR)
    if detectors.HasField("dynatrace"):
        names.append(_DYNATRACE_DETECTOR)
    if semantic and _ENVIRONMENT_DETECTOR not in names:
        # The semantic conventions read OTEL_RESOURCE_ATTRIBUTES, which the environment detector reads.
        names.append(_ENVIRONMENT_DETECTOR)
    for name in names:
        detector: Any = (
            environment_resource_detector_pb2.EnvironmentResourceDetectorConfig()
            if name == _ENVIRONMENT_DETECTOR
            else dynatrace_resource_detector_pb2.DynatraceResourceDetectorConfig()
        )
        config.resource_detectors.append(
            extension_pb2.TypedExtensionConfig(name=name, typed_config=pack(detector))
        )
    if settings.HasField("dynatrace_sampler"):
        config.sampler.CopyFrom(_dynatrace_sampler(push, settings, hostname, cluster))
    return config


def provider_block(push: PushContext, provider: Any, inputs: ProxyInputs) -> Any:
    """The HCM tracing block a provider configures (sampling and tags not yet set)."""
    kind = provider.WhichOneof("provider")
    block = hcm_pb2.HttpConnectionManager.Tracing()
    spawn_upstream = inputs.router
    max_tag_length = 0
    if kind == "zipkin":
        name, config = ZIPKIN, _zipkin(push, provider, inputs)
        max_tag_length = provider.zipkin.max_tag_length
    elif kind == "datadog":
        name, config = DATADOG, _datadog(push, provider.datadog, inputs)
        max_tag_length = provider.datadog.max_tag_length
    elif kind == "skywalking":
        name, config = SKYWALKING, _skywalking(push, provider.skywalking)
        spawn_upstream = True
    elif kind == "opentelemetry":
        name, config = OPENTELEMETRY, _opentelemetry(push, provider.opentelemetry, inputs)
        max_tag_length = provider.opentelemetry.max_tag_length
    elif kind == "lightstep":
        raise Unbuilt("the lightstep tracer was removed from Envoy; istiod builds none either")
    else:
        raise Unbuilt(f"a {kind} provider does not support tracing")
    if spawn_upstream:
        block.spawn_upstream_span.value = True
    block.provider.name = name
    block.provider.typed_config.CopyFrom(pack(config))
    if max_tag_length:
        block.max_path_tag_length.value = max_tag_length
    return block
