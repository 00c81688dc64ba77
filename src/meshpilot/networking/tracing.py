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

A tracing block depends on the proxy only through the inputs ``ProxyInputs`` names, so it is built
once per snapshot for each distinct set of them. The set holds only what the block being built
reads (the version reduced to the thresholds tested here): what a client sends beyond that, such
as a random version, must not add memo entries. A provider meshpilot cannot configure is logged and
counted by name (``telemetry_problems``) and the HCM gets no tracing, as istiod leaves it when its
provider setup fails. The tracers of the providers themselves are built in ``tracing_providers``.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.type.tracing.v3 import custom_tag_pb2
from google.protobuf import json_format

from meshpilot._proto.istio.mesh.v1alpha1 import proxy_pb2
from meshpilot.model.mesh import MeshConfig
from meshpilot.model.proxy import NodeType, Proxy
from meshpilot.model.push_context import PushContext
from meshpilot.model.telemetry import TelemetryClass, TracingConfig, TracingSpec, tracing
from meshpilot.networking.protobuf import uint32
from meshpilot.networking.telemetry_problems import provider_problem
from meshpilot.networking.tracing_providers import ProxyInputs, Unbuilt, provider_block

log = logging.getLogger(__name__)

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


def _inputs(proxy: Proxy, push: PushContext, spec: TracingSpec | None) -> ProxyInputs:
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
            provider.opentelemetry.service_attribute_enrichment
            == MeshConfig.ExtensionProvider.OTEL_SEMANTIC_CONVENTIONS
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
    return ProxyInputs(
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


def _istio_tags(inputs: ProxyInputs) -> list[Any]:
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


def _tags(inputs: ProxyInputs, spec: TracingSpec | None, proxy_tracing: Any) -> list[Any]:
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


# -- the HCM's block ------------------------------------------------------------------------------


def _legacy(push: PushContext, inputs: ProxyInputs) -> HcmTracing:
    if not push.mesh.enable_tracing:
        return _NONE
    proxy_tracing = _proxy_tracing(inputs.proxy_tracing)
    block = hcm_pb2.HttpConnectionManager.Tracing()
    _sampling(block, _proxy_config_sampling(proxy_tracing))
    block.custom_tags.extend(_tags(inputs, None, proxy_tracing))
    if proxy_tracing.max_path_tag_length:
        block.max_path_tag_length.CopyFrom(uint32(proxy_tracing.max_path_tag_length))
    return HcmTracing(block)


def _from_spec(push: PushContext, spec: TracingSpec, inputs: ProxyInputs) -> HcmTracing:
    if spec.disabled:
        return _NONE
    try:
        block = provider_block(push, spec.provider, inputs)
    except Unbuilt as err:
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
