"""The HTTP connection manager's tracing: MeshConfig's legacy settings and Telemetry providers."""

from __future__ import annotations

from typing import Any

from envoy.config.listener.v3 import listener_pb2
from envoy.config.trace.v3 import opentelemetry_pb2, zipkin_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from support.kube import istio, service, workload
from support.mesh_objects import CLIENT, mesh_objects
from support.model import Model, build

from meshpilot.model.push_request import PushRequest
from meshpilot.model.telemetry import TelemetryClass
from meshpilot.networking import tracing
from meshpilot.networking.telemetry_problems import TELEMETRY_PROBLEMS
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.generators.base import GenerationContext
from meshpilot.xds.generators.lds import ListenerGenerator

GATEWAY = "router~10.1.0.100~gw-1.istio-system~istio-system.svc.cluster.local"
SHOP = "sidecar~10.1.0.71~shop-1.default~default.svc.cluster.local"
_CANONICAL = {"service.istio.io/canonical-name": "shop", "service.istio.io/canonical-revision": "v7"}


def _shop() -> list[dict[str, Any]]:
    """A workload whose Pod carries the canonical labels the injector adds."""
    return workload("shop", "default", "10.96.0.70", 8080, {"shop-1": "10.1.0.71"}, labels=_CANONICAL)


def _tags(block: Any) -> dict[str, Any]:
    return {t.tag: t for t in block.custom_tags}


def _block(model: Model, cls: TelemetryClass = TelemetryClass.CLIENT, node: str = CLIENT, **meta: Any) -> Any:
    return tracing.hcm_tracing(model.push, model.proxy(node, meta), cls)


def test_enable_tracing_samples_one_percent_with_istio_tags() -> None:
    found = _block(build([*mesh_objects(), *_shop()]), node=SHOP)
    block = found.tracing
    assert found.use_request_id_for_trace_sampling
    assert (block.random_sampling.value, block.client_sampling.value, block.overall_sampling.value) == (
        tracing.TRACE_SAMPLING,
        100.0,
        100.0,
    )
    assert not block.HasField("provider")
    tags = _tags(block)
    assert tags["istio.canonical_service"].literal.value == "shop"
    assert tags["istio.canonical_revision"].literal.value == "v7"
    assert tags["istio.namespace"].literal.value == "default"
    assert tags["istio.mesh_id"].literal.value == "unknown"
    dry_run = tags["istio.authorization.dry_run.deny_policy.result"].metadata
    assert dry_run.metadata_key.key == "envoy.filters.http.rbac"
    assert [t.tag for t in block.custom_tags] == sorted(tags)


def test_enable_tracing_off_leaves_hcms_without_tracing() -> None:
    assert _block(build(mesh_objects(), "enableTracing: false\n")).tracing is None


def test_pilot_trace_sampling() -> None:
    assert tracing.trace_sampling({}) == 1.0
    assert tracing.trace_sampling({"PILOT_TRACE_SAMPLING": "42.5"}) == 42.5
    assert tracing.trace_sampling({"PILOT_TRACE_SAMPLING": "101"}) == 1.0
    assert tracing.trace_sampling({"PILOT_TRACE_SAMPLING": "lots"}) == 1.0


_DEFAULT_CONFIG = """
defaultConfig:
  tracing:
    sampling: 20
    maxPathTagLength: 99
    enableIstioTags: false
    customTags:
      team: {literal: {value: payments}}
      tenant: {header: {name: x-tenant, defaultValue: none}}
      node: {environment: {name: NODE_NAME}}
"""


def test_default_config_tracing_sets_sampling_tags_and_path_length() -> None:
    block = _block(build(mesh_objects(), _DEFAULT_CONFIG)).tracing
    assert block.random_sampling.value == 20.0
    assert block.max_path_tag_length.value == 99
    tags = _tags(block)
    assert sorted(tags) == ["node", "team", "tenant"]
    assert tags["team"].literal.value == "payments"
    assert tags["tenant"].request_header.name == "x-tenant"
    assert tags["tenant"].request_header.default_value == "none"
    assert tags["node"].environment.name == "NODE_NAME"


def test_sampling_over_100_falls_back_to_one_percent() -> None:
    block = _block(build(mesh_objects(), "defaultConfig:\n  tracing: {sampling: 150}\n")).tracing
    assert block.random_sampling.value == 1.0


def test_the_proxys_own_proxy_config_wins_over_default_config() -> None:
    model = build(mesh_objects(), _DEFAULT_CONFIG)
    block = _block(model, PROXY_CONFIG={"tracing": {"sampling": 7}}).tracing
    assert block.random_sampling.value == 7.0
    assert "istio.namespace" in _tags(block)
    assert not block.HasField("max_path_tag_length")


_PROVIDERS = """
extensionProviders:
- name: zipkin
  zipkin: {service: zipkin.observability.svc.cluster.local, port: 9411, maxTagLength: 64}
- name: otel
  opentelemetry:
    service: observability/otel.observability.svc.cluster.local
    port: 4318
    http: {path: /v1/traces, timeout: 2s, headers: [{name: x-key, value: secret}]}
- name: dynatrace
  opentelemetry:
    service: otel.observability.svc.cluster.local
    port: 4318
    http: {path: /api/v2/otlp/v1/traces}
    dynatraceSampler: {tenant: t, clusterId: 7, rootSpansPerMinute: 100}
- name: nowhere
  zipkin: {service: nowhere.example.com, port: 9411}
- name: lightstep
  lightstep: {service: zipkin.observability.svc.cluster.local, port: 9411, accessToken: t}
"""


def _with_telemetry(*entries: dict[str, Any]) -> Model:
    collectors = [
        service("zipkin", "observability", "10.96.9.1", [("http", 9411)]),
        service("otel", "observability", "10.96.9.2", [("http", 4318)]),
    ]
    telemetry = istio("Telemetry", "mesh", "istio-system", {"tracing": list(entries)}, group="telemetry")
    return build([*mesh_objects(), *collectors, telemetry], _PROVIDERS)


def _zipkin(block: Any) -> Any:
    assert block.provider.name == "envoy.tracers.zipkin"
    out = zipkin_pb2.ZipkinConfig()
    block.provider.typed_config.Unpack(out)
    return out


def test_zipkin_provider_reaches_the_collectors_outbound_cluster() -> None:
    model = _with_telemetry(
        {
            "providers": [{"name": "zipkin"}],
            "randomSamplingPercentage": 100,
            "customTags": {"team": {"literal": {"value": "payments"}}},
            "useRequestIdForTraceSampling": False,
        }
    )
    found = _block(model)
    assert not found.use_request_id_for_trace_sampling
    block = found.tracing
    assert block.random_sampling.value == 100.0
    assert block.max_path_tag_length.value == 64
    assert not block.HasField("spawn_upstream_span")
    assert {"team", "istio.canonical_service"} <= set(_tags(block))
    # A 1.28 proxy: the collector named by cluster, endpoint and host.
    legacy = _zipkin(block)
    assert legacy.collector_cluster == "outbound|9411||zipkin.observability.svc.cluster.local"
    assert legacy.collector_endpoint == "/api/v2/spans"
    assert legacy.collector_hostname == "zipkin.observability.svc.cluster.local"
    assert legacy.trace_id_128bit and legacy.collector_endpoint_version == zipkin_pb2.ZipkinConfig.HTTP_JSON
    assert legacy.trace_context_option == zipkin_pb2.ZipkinConfig.USE_B3
    # From 1.29 (and with no version at all: istiod takes that as the newest), an HTTP service.
    for version in ("1.29.1", ""):
        current = _zipkin(_block(model, ISTIO_VERSION=version).tracing)
        assert not current.collector_cluster
        uri = current.collector_service.http_uri
        assert uri.uri == "http://zipkin.observability.svc.cluster.local/api/v2/spans"
        assert uri.cluster == "outbound|9411||zipkin.observability.svc.cluster.local"
        assert uri.timeout.seconds == 5


def test_server_side_may_use_another_provider() -> None:
    model = _with_telemetry(
        {"providers": [{"name": "zipkin"}]},
        {"match": {"mode": "SERVER"}, "providers": [{"name": "otel"}], "enableIstioTags": False},
    )
    client = _block(model, TelemetryClass.CLIENT).tracing
    server = _block(model, TelemetryClass.SERVER).tracing
    assert client.provider.name == "envoy.tracers.zipkin"
    assert server.provider.name == "envoy.tracers.opentelemetry"
    assert not server.custom_tags
    otel = opentelemetry_pb2.OpenTelemetryConfig()
    server.provider.typed_config.Unpack(otel)
    uri = otel.http_service.http_uri
    assert uri.uri == "otel.observability.svc.cluster.local/v1/traces"
    assert uri.cluster == "outbound|4318||otel.observability.svc.cluster.local"
    assert uri.timeout.seconds == 2
    assert [(h.header.key, h.header.value) for h in otel.http_service.request_headers_to_add] == [
        ("x-key", "secret")
    ]


def test_a_provider_with_its_own_sampler_is_sent_every_request() -> None:
    model = _with_telemetry({"providers": [{"name": "dynatrace"}], "randomSamplingPercentage": 5})
    block = _block(model).tracing
    assert block.random_sampling.value == 100.0
    otel = opentelemetry_pb2.OpenTelemetryConfig()
    block.provider.typed_config.Unpack(otel)
    assert otel.sampler.name == "envoy.tracers.opentelemetry.samplers.dynatrace"


def test_gateways_spawn_upstream_spans() -> None:
    model = _with_telemetry({"providers": [{"name": "zipkin"}]})
    block = _block(model, node=GATEWAY).tracing
    assert block.spawn_upstream_span.value is True
    assert _tags(block)["istio.namespace"].literal.value == "istio-system"


def test_providers_that_cannot_be_built_leave_no_tracing_and_are_counted() -> None:
    for name, kind in (("nowhere", "zipkin"), ("lightstep", "lightstep")):
        before = TELEMETRY_PROBLEMS.count(kind, name)
        found = _block(_with_telemetry({"providers": [{"name": name}]}))
        assert found.tracing is None
        assert TELEMETRY_PROBLEMS.count(kind, name) > before


def test_disabled_span_reporting() -> None:
    model = _with_telemetry({"providers": [{"name": "zipkin"}], "disableSpanReporting": True})
    assert _block(model).tracing is None


def test_istio_version() -> None:
    assert tracing.istio_version("1.28.2") == (1, 28, 2)
    assert tracing.istio_version("1.31-dev") == (1, 31, 65535)
    assert tracing.istio_version("release-1.29") == (1, 29, 65535)
    assert tracing.istio_version("") == (65535, 65535, 65535)


def test_blocks_are_shared_by_proxies_with_the_same_inputs() -> None:
    model = build([*mesh_objects(), *_shop()])
    assert _block(model).tracing is _block(model).tracing
    # The canonical service is a tag: another workload gets its own block.
    other = _block(model, node=SHOP).tracing
    assert other is not _block(model).tracing
    assert _tags(other)["istio.canonical_service"].literal.value == "shop"


def _generated_tags(model: Model, node: str) -> set[str]:
    """The istio.canonical_service values of every HCM in the LDS answer ``node`` gets."""
    proxy = model.proxy(node, {"INTERCEPTION_MODE": "REDIRECT"})
    ctx = GenerationContext(proxy, model.push, model.index, PushRequest(push=model.push))
    watch = WatchedResource("type.googleapis.com/envoy.config.listener.v3.Listener")
    found = set()
    for resource in ListenerGenerator().generate(ctx, watch, None) or []:
        listener = listener_pb2.Listener()
        resource.message().Unpack(listener)
        for chain in [*listener.filter_chains, listener.default_filter_chain]:
            for f in chain.filters:
                if f.name == "envoy.filters.network.http_connection_manager":
                    hcm = hcm_pb2.HttpConnectionManager()
                    f.typed_config.Unpack(hcm)
                    found.add(_tags(hcm.tracing)["istio.canonical_service"].literal.value)
    return found


def test_listeners_cached_for_a_scope_still_carry_each_workloads_tags() -> None:
    model = build([*mesh_objects(), *_shop()])
    # Same namespace, same scope: the shared outbound listeners must not carry the other's tags.
    assert _generated_tags(model, CLIENT) == {"unknown"}
    assert _generated_tags(model, SHOP) == {"shop"}


def _lds(model: Model, node: str, **meta: Any) -> list[bytes]:
    proxy = model.proxy(node, {"INTERCEPTION_MODE": "REDIRECT", **meta})
    ctx = GenerationContext(proxy, model.push, model.index, PushRequest(push=model.push))
    watch = WatchedResource("type.googleapis.com/envoy.config.listener.v3.Listener")
    return [r.payload for r in ListenerGenerator().generate(ctx, watch, None) or []]


_CLIENT_ZIPKIN = {
    "match": {"mode": "CLIENT"},
    "providers": [{"name": "zipkin"}],
    "useRequestIdForTraceSampling": False,
    "customTags": {"team": {"literal": {"value": "payments"}}},
}


def _shop_mesh(*entries: dict[str, Any]) -> Model:
    collectors = [service("zipkin", "observability", "10.96.9.1", [("http", 9411)])]
    telemetry = [istio("Telemetry", "mesh", "istio-system", {"tracing": list(entries)}, group="telemetry")]
    return build([*mesh_objects(), *_shop(), *collectors, *(telemetry if entries else [])], _PROVIDERS)


def test_listeners_retraced_for_a_workload_are_byte_for_byte_those_built_for_it() -> None:
    for entries in ((), (_CLIENT_ZIPKIN,)):
        shared = _shop_mesh(*entries)
        first = _lds(shared, CLIENT)
        # SHOP shares CLIENT's scope: its outbound listeners are CLIENT's, re-traced.
        retraced = _lds(shared, SHOP)
        built = _lds(_shop_mesh(*entries), SHOP)
        assert retraced == built
        assert set(first) & set(retraced)  # listeners without HCMs are the very same
        assert set(retraced) - set(first)  # and those with HCMs carry SHOP's tags


def test_what_clients_send_beyond_what_tracing_reads_adds_no_memo_entries() -> None:
    # A flood of connections with made-up versions and node metadata must not grow the memo.
    for entries in ((), ({"providers": [{"name": "zipkin"}]},), ({"providers": [{"name": "otel"}]},)):
        model = _shop_mesh(*entries)
        _lds(model, SHOP, ISTIO_VERSION="1.31.0")
        before = (len(model.push._memo), len(model.push._lasting))
        for i in range(20):
            _lds(
                model,
                SHOP,
                ISTIO_VERSION=f"1.{31 + i}.{i}" if i % 2 else f"v{i:x}",
                APP_CONTAINERS=f"app-{i}",
                WORKLOAD_NAME=f"made-up-{i}",
            )
        assert (len(model.push._memo), len(model.push._lasting)) == before, entries


def test_formatter_tags_are_left_out_for_older_proxies_and_counted() -> None:
    tags = {"route": {"formatter": {"value": "%ROUTE_NAME%"}}}
    model = _with_telemetry({"providers": [{"name": "zipkin"}], "customTags": tags})
    before = TELEMETRY_PROBLEMS.count("zipkin", "zipkin")
    assert "route" not in _tags(_block(model, ISTIO_VERSION="1.28.0").tracing)
    assert TELEMETRY_PROBLEMS.count("zipkin", "zipkin") > before
    assert _tags(_block(model, ISTIO_VERSION="1.29.0").tracing)["route"].value == "%ROUTE_NAME%"
