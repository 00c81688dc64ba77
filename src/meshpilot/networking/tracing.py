"""The ``tracing`` block of HTTP connection managers, as istiod's tracing.go writes it.

Two sources: the Telemetry API's ``tracing`` (and MeshConfig ``defaultProviders.tracing``), resolved
per proxy by ``model.telemetry``, names an extension provider (zipkin, opentelemetry, skywalking,
datadog) whose tracer goes into the HCM with the cluster of the provider's collector service. Without
it, the legacy MeshConfig ``enableTracing`` gives every HCM sampling and tags only: the tracer itself
is then the bootstrap's (``defaultConfig.tracing``: zipkin, lightstep, datadog, stackdriver,
opencensus), which the proxy's agent writes, as with istiod.

Sampling: a provider's own sampler samples everything it is sent (100%), else the Telemetry
``randomSamplingPercentage``, else the proxy config's ``tracing.sampling``, else ``PILOT_TRACE_SAMPLING``
(read once at start, 1% by default). Tags: Istio's own (canonical service and revision, mesh,
namespace, cluster, and the dry-run authorization results), then the Telemetry's or the proxy
config's custom tags, sorted by name.

A tracing block depends on the proxy only through the inputs ``_ProxyInputs`` names, so it is built
once per snapshot for each distinct set of them. The set holds only what the block being built
reads (the version reduced to the thresholds tested here): what a client sends beyond that, such
as a random version, must not add memo entries. A provider meshpilot cannot configure is logged and
counted by name (``telemetry_problems``) and the HCM gets no tracing, as istiod leaves it when its
provider setup fails.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
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
from envoy.type.tracing.v3 import custom_tag_pb2
from google.protobuf import json_format

from meshpilot._proto.istio.mesh.v1alpha1 import proxy_pb2
from meshpilot.model.mesh import MeshConfig
from meshpilot.model.proxy import NodeType, Proxy
from meshpilot.model.push_context import PushContext
from meshpilot.model.telemetry import TelemetryClass, TracingConfig, TracingSpec, tracing
from meshpilot.networking.ext_authz import lookup_cluster
from meshpilot.networking.protobuf import pack, uint32
from meshpilot.networking.telemetry_problems import provider_problem

log = logging.getLogger(__name__)

ZIPKIN = "envoy.tracers.zipkin"
DATADOG = "envoy.tracers.datadog"
OPENTELEMETRY = "envoy.tracers.opentelemetry"
SKYWALKING = "envoy.tracers.skywalking"

_Provider = MeshConfig.ExtensionProvider
_ENVIRONMENT_DETECTOR = "envoy.tracers.opentelemetry.resource_detectors.environment"
_DYNATRACE_DETECTOR = "envoy.tracers.opentelemetry.resource_detectors.dynatrace"
_DYNATRACE_SAMPLER = "envoy.tracers.opentelemetry.samplers.dynatrace"
#: The RBAC filter's dynamic metadata keys of the dry-run (shadow) results.
_DRY_RUN_TAGS = (
    ("istio.authorization.dry_run.allow_policy.name", "istio_dry_run_allow_shadow_effective_policy_id"),
    ("istio.authorization.dry_run.allow_policy.result", "istio_dry_run_allow_shadow_engine_result"),
    ("istio.authorization.dry_run.deny_policy.name", "istio_dry_run_deny_shadow_effective_policy_id"),
    ("istio.authorization.dry_run.deny_policy.result", "istio_dry_run_deny_shadow_engine_result"),
)
_VERSION = re.compile(r"^([1-9]+)\.([0-9]+)(\.([0-9]+))?")
#: istiod's version of a proxy that names none: newer than any.
_LATEST = (65535, 65535, 65535)
#: Every version this module compares a proxy's with, newest first (see _version_step).
_VERSION_STEPS = ((1, 30, 0), (1, 29, 0), (1, 28, 0))
_OLDEST = (0, 0, 0)


def trace_sampling(environ: Mapping[str, str]) -> float:
    """``PILOT_TRACE_SAMPLING``: the default percentage of requests traced, 1% unless set (0-100)."""
    text = environ.get("PILOT_TRACE_SAMPLING", "")
    if not text:
        return 1.0
    try:
        value = float(text)
    except ValueError:
        log.warning("PILOT_TRACE_SAMPLING %r is not a number; 1%% is used", text)
        return 1.0
    if not 0.0 <= value <= 100.0:
        log.warning("PILOT_TRACE_SAMPLING out of range: %s; 1%% is used", text)
        return 1.0
    return value


#: Read once, as istiod reads its environment at start.
TRACE_SAMPLING = trace_sampling(os.environ)


@dataclass(frozen=True, slots=True)
class HcmTracing:
    """What tracing sets on an HCM: its ``tracing`` block (or None) and the request ID's say."""

    tracing: Any | None
    use_request_id_for_trace_sampling: bool = True
    #: Both, serialized: part of the cache keys of listeners holding them.
    fingerprint: bytes = field(init=False)

    def __post_init__(self) -> None:
        block = b"" if self.tracing is None else self.tracing.SerializeToString(deterministic=True)
        flag = b"1" if self.use_request_id_for_trace_sampling else b"0"
        object.__setattr__(self, "fingerprint", flag + block)


_NONE = HcmTracing(None)


def istio_version(text: str) -> tuple[int, int, int]:
    """istiod's ParseIstioVersion: (major, minor, patch); a missing patch, or version, is the latest."""
    found = _VERSION.match(text.removeprefix("release-"))
    if found is None:
        return _LATEST
    patch = int(found.group(4)) if found.group(4) else 65535
    return int(found.group(1)), int(found.group(2)), patch


def _version_step(version: tuple[int, int, int]) -> tuple[int, int, int]:
    """The newest of ``_VERSION_STEPS`` that ``version`` reaches: every comparison here gives the
    same answer for both, and a memo key holds one of four values instead of the client's string."""
    for step in _VERSION_STEPS:
        if version >= step:
            return step
    return _OLDEST


@dataclass(frozen=True, slots=True)
class _ProxyInputs:
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


def _proxy_tracing_json(proxy: Proxy, push: PushContext) -> str:
    raw = proxy.metadata.raw.get("PROXY_CONFIG")
    if isinstance(raw, dict):
        # istiod uses the proxy's own config whole when it sent one (ProxyConfigOrDefault).
        found = raw.get("tracing")
        return json.dumps(found, sort_keys=True) if isinstance(found, dict) else ""
    return push.memoized(("mesh-proxy-tracing",), lambda: _mesh_tracing_json(push))


def _mesh_tracing_json(push: PushContext) -> str:
    if push.mesh.default_config.HasField("tracing"):
        return json_format.MessageToJson(push.mesh.default_config.tracing, sort_keys=True, indent=None)
    return ""


def _otel_service_name(proxy: Proxy) -> str:
    """The OpenTelemetry semantic conventions' service name of a Kubernetes workload."""
    raw = proxy.metadata.raw
    annotations = raw.get("ANNOTATIONS")
    if isinstance(annotations, dict):
        value = annotations.get("resource.opentelemetry.io/service.name")
        if isinstance(value, str) and value:
            return value
    for label in ("app.kubernetes.io/instance", "app.kubernetes.io/name"):
        if proxy.labels.get(label):
            return proxy.labels[label]
    if proxy.metadata.workload_name:
        return proxy.metadata.workload_name
    pod, dot, _ = proxy.id.partition(".")
    if dot and pod:
        return pod
    containers = raw.get("APP_CONTAINERS")
    if isinstance(containers, str) and containers and "," not in containers:
        return containers
    return "unknown_service"


def _inputs(proxy: Proxy, push: PushContext, spec: TracingSpec | None) -> _ProxyInputs:
    """What the block for ``spec`` (None: the legacy one) reads of ``proxy``, and nothing else."""
    proxy_tracing = _proxy_tracing_json(proxy, push)
    if spec is None:
        # Whether the proxy config turns Istio's tags off is read when building; the tags are kept.
        istio_tags = True
        router, node_cluster, otel_service_name, version = False, "", "", _OLDEST
    else:
        istio_tags = spec.enable_istio_tags
        provider = spec.provider
        assert provider is not None  # a spec without one is disabled, and has no inputs
        kind = provider.WhichOneof("provider")
        semantic = kind == "opentelemetry" and (
            provider.opentelemetry.service_attribute_enrichment == _Provider.OTEL_SEMANTIC_CONVENTIONS
        )
        router = proxy.type is NodeType.ROUTER
        node_cluster = proxy.node_cluster if kind in ("datadog", "opentelemetry") and not semantic else ""
        otel_service_name = _otel_service_name(proxy) if semantic else ""
        version = _version_step(istio_version(proxy.metadata.istio_version))
    service = revision = mesh_id = namespace = cluster_id = ""
    if istio_tags:
        labels, metadata = proxy.labels, proxy.metadata
        service = labels.get("service.istio.io/canonical-name") or "unknown"
        revision = labels.get("service.istio.io/canonical-revision") or "latest"
        mesh_id = metadata.mesh_id or "unknown"
        namespace = metadata.namespace or "default"
        cluster_id = metadata.cluster_id or "unknown"
    return _ProxyInputs(
        router=router,
        canonical_service=service,
        canonical_revision=revision,
        mesh_id=mesh_id,
        namespace=namespace,
        cluster_id=cluster_id,
        node_cluster=node_cluster,
        version=version,
        proxy_tracing=proxy_tracing,
        otel_service_name=otel_service_name,
    )


def _proxy_tracing(text: str) -> Any:
    out = proxy_pb2.Tracing()
    if text:
        json_format.Parse(text, out, ignore_unknown_fields=True)
    return out


# -- tags -----------------------------------------------------------------------------------------


def _literal(tag: str, value: str) -> Any:
    return custom_tag_pb2.CustomTag(tag=tag, literal=custom_tag_pb2.CustomTag.Literal(value=value))


def _istio_tags(inputs: _ProxyInputs) -> list[Any]:
    tags = []
    for name, key in _DRY_RUN_TAGS:
        tag = custom_tag_pb2.CustomTag(tag=name)
        tag.metadata.kind.request.SetInParent()
        tag.metadata.metadata_key.key = "envoy.filters.http.rbac"
        tag.metadata.metadata_key.path.add(key=key)
        tags.append(tag)
    tags.append(_literal("istio.canonical_revision", inputs.canonical_revision))
    tags.append(_literal("istio.canonical_service", inputs.canonical_service))
    tags.append(_literal("istio.mesh_id", inputs.mesh_id))
    tags.append(_literal("istio.namespace", inputs.namespace))
    tags.append(_literal("istio.cluster_id", inputs.cluster_id))
    return tags


def _custom_tag(name: str, spec: Any, *, formatter: bool) -> Any | None:
    """An Envoy custom tag from a Telemetry or proxy-config tag (their shapes agree but for names)."""
    kind = spec.WhichOneof("type")
    tag = custom_tag_pb2.CustomTag(tag=name)
    if kind == "literal":
        tag.literal.value = spec.literal.value
    elif kind == "environment":
        tag.environment.name = spec.environment.name
        tag.environment.default_value = spec.environment.default_value
    elif kind == "header":
        tag.request_header.name = spec.header.name
        tag.request_header.default_value = spec.header.default_value
    elif kind == "formatter" and formatter:
        tag.value = spec.formatter.value
    else:
        return None
    return tag


def _istio_tags_enabled(spec: TracingSpec | None, proxy_tracing: Any) -> bool:
    if spec is None:
        return not proxy_tracing.HasField("enable_istio_tags") or bool(proxy_tracing.enable_istio_tags.value)
    return spec.enable_istio_tags


def _tags(inputs: _ProxyInputs, spec: TracingSpec | None, proxy_tracing: Any) -> list[Any]:
    tags = _istio_tags(inputs) if _istio_tags_enabled(spec, proxy_tracing) else []
    if spec is not None and spec.custom_tags:
        # Formatter tags need an Istio 1.29 proxy; istiod leaves them out for older ones.
        formatter = inputs.version >= (1, 29, 0)
        if not formatter and any(t.WhichOneof("type") == "formatter" for t in spec.custom_tags.values()):
            provider_problem(
                spec.provider, "formatter custom tags need an Istio 1.29 proxy; left out for older ones"
            )
        found = (_custom_tag(n, t, formatter=formatter) for n, t in spec.custom_tags.items())
    else:
        found = (_custom_tag(n, t, formatter=False) for n, t in proxy_tracing.custom_tags.items())
    tags.extend(t for t in found if t is not None)
    tags.sort(key=lambda t: t.tag)
    return tags


def _sampling(block: Any, percentage: float) -> None:
    block.client_sampling.value = 100.0
    block.overall_sampling.value = 100.0
    block.random_sampling.value = percentage


def _proxy_config_sampling(proxy_tracing: Any) -> float:
    sampling = proxy_tracing.sampling
    if sampling == 0.0:
        return TRACE_SAMPLING
    return 1.0 if sampling > 100.0 else float(sampling)


# -- providers ------------------------------------------------------------------------------------


class _Unbuilt(Exception):
    """A provider that cannot be configured; the message says why."""


def _cluster(push: PushContext, service: str, port: int) -> tuple[str, str]:
    found = lookup_cluster(push, service, port)
    if isinstance(found, str):
        raise _Unbuilt(f"could not find cluster for tracing provider: {found}")
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


def _zipkin(push: PushContext, provider: Any, inputs: _ProxyInputs) -> Any:
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


def _datadog(push: PushContext, settings: Any, inputs: _ProxyInputs) -> Any:
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
        raise _Unbuilt("the Dynatrace sampler has no HTTP service and the exporter is not OTLP/HTTP")
    service = config.http_service
    service.http_uri.uri = uri
    service.http_uri.cluster = api_cluster
    if http.HasField("timeout"):
        service.http_uri.timeout.CopyFrom(http.timeout)
    service.request_headers_to_add.extend(_headers(http.headers))
    return extension_pb2.TypedExtensionConfig(name=_DYNATRACE_SAMPLER, typed_config=pack(config))


def _opentelemetry(push: PushContext, settings: Any, inputs: _ProxyInputs) -> Any:
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


def _provider_block(push: PushContext, provider: Any, inputs: _ProxyInputs) -> Any:
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
        raise _Unbuilt("the lightstep tracer was removed from Envoy; istiod builds none either")
    else:
        raise _Unbuilt(f"a {kind} provider does not support tracing")
    if spawn_upstream:
        block.spawn_upstream_span.value = True
    block.provider.name = name
    block.provider.typed_config.CopyFrom(pack(config))
    if max_tag_length:
        block.max_path_tag_length.value = max_tag_length
    return block


# -- the HCM's block ------------------------------------------------------------------------------


def _legacy(push: PushContext, inputs: _ProxyInputs) -> HcmTracing:
    if not push.mesh.enable_tracing:
        return _NONE
    proxy_tracing = _proxy_tracing(inputs.proxy_tracing)
    block = hcm_pb2.HttpConnectionManager.Tracing()
    _sampling(block, _proxy_config_sampling(proxy_tracing))
    block.custom_tags.extend(_tags(inputs, None, proxy_tracing))
    if proxy_tracing.max_path_tag_length:
        block.max_path_tag_length.CopyFrom(uint32(proxy_tracing.max_path_tag_length))
    return HcmTracing(block)


def _from_spec(push: PushContext, spec: TracingSpec, inputs: _ProxyInputs) -> HcmTracing:
    if spec.disabled:
        return _NONE
    try:
        block = _provider_block(push, spec.provider, inputs)
    except _Unbuilt as err:
        provider_problem(spec.provider, str(err))
        return _NONE
    proxy_tracing = _proxy_tracing(inputs.proxy_tracing)
    if _has_sampler(spec.provider):
        # The provider's sampler decides; Envoy hands it every request.
        sampling = 100.0
    elif spec.random_sampling_percentage is not None:
        sampling = spec.random_sampling_percentage
    else:
        sampling = _proxy_config_sampling(proxy_tracing)
    _sampling(block, sampling)
    block.custom_tags.extend(_tags(inputs, spec, proxy_tracing))
    if not block.HasField("max_path_tag_length") and proxy_tracing.max_path_tag_length:
        block.max_path_tag_length.CopyFrom(uint32(proxy_tracing.max_path_tag_length))
    if spec.disable_context_propagation and inputs.version >= (1, 30, 0):
        provider_problem(
            spec.provider, "disableContextPropagation is not built by meshpilot; context propagates"
        )
    return HcmTracing(block, spec.use_request_id_for_trace_sampling)


def _has_sampler(provider: Any) -> bool:
    """Whether the provider samples itself (istiod then has Envoy sample everything)."""
    if provider.WhichOneof("provider") != "opentelemetry":
        return False
    return bool(provider.opentelemetry.HasField("dynatrace_sampler"))


def hcm_tracing(push: PushContext, proxy: Proxy, cls: TelemetryClass) -> HcmTracing:
    """The tracing of an HCM serving ``cls`` on ``proxy`` (gateways are clients)."""
    return _hcm_tracing(push, proxy, tracing(push, proxy), cls)


def _hcm_tracing(
    push: PushContext, proxy: Proxy, config: TracingConfig | None, cls: TelemetryClass
) -> HcmTracing:
    if config is None:
        if not push.mesh.enable_tracing:
            return _NONE
        legacy = _inputs(proxy, push, None)
        return push.memoized(("hcm-tracing", None, legacy), lambda: _legacy(push, legacy))
    spec = config.client if cls is TelemetryClass.CLIENT else config.server
    if spec.disabled:
        return _NONE
    inputs = _inputs(proxy, push, spec)
    return push.memoized(("hcm-tracing", spec.key, inputs), lambda: _from_spec(push, spec, inputs))


def key(push: PushContext, proxy: Proxy) -> tuple[bytes, ...]:
    """The proxy's tracing of both sides, for cache keys of what holds it.

    The built blocks, not their inputs: whether a provider's collector service exists is part of
    the outcome, and listeners kept across snapshots must change when it does.
    """
    client, server = sides(push, proxy)
    return (client.fingerprint, server.fingerprint)


def sides(push: PushContext, proxy: Proxy) -> tuple[HcmTracing, HcmTracing]:
    """The tracing of ``proxy``'s client-side and server-side HCMs."""
    config = tracing(push, proxy)
    if config is None:
        legacy = _hcm_tracing(push, proxy, None, TelemetryClass.CLIENT)
        return legacy, legacy
    return (
        _hcm_tracing(push, proxy, config, TelemetryClass.CLIENT),
        _hcm_tracing(push, proxy, config, TelemetryClass.SERVER),
    )
