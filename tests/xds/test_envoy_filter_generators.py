"""The generators apply EnvoyFilter patches to the proxies they select, share the patched lists, and
leave every other proxy's output as it was."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.http.lua.v3 import lua_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from prometheus_client import CollectorRegistry
from support.envoy_filters import config_of, envoy_filter
from support.kube import istio, pod, service
from support.mesh_objects import CLIENT, mesh_objects
from support.model import Model, build

from meshpilot.config.store import ConfigStore
from meshpilot.config.unapplied import UnappliedConfig
from meshpilot.model.config import ConfigKey
from meshpilot.model.kind import Kind
from meshpilot.model.push_request import PushRequest
from meshpilot.networking.envoyfilter.patches import unapplied
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.generators import sidecar_generators
from meshpilot.xds.generators.base import GenerationContext, Resource
from meshpilot.xds.generators.eds import EndpointGenerator
from meshpilot.xds.types import TypeUrl

REVIEWS = "sidecar~10.1.0.21~reviews-v1.default~default.svc.cluster.local"
LUA_TYPE = "type.googleapis.com/" + lua_pb2.Lua.DESCRIPTOR.full_name
HCM = "envoy.filters.network.http_connection_manager"

TIMEOUT = {
    "applyTo": "CLUSTER",
    "match": {"context": "SIDECAR_OUTBOUND", "cluster": {"service": "reviews.default.svc.cluster.local"}},
    "patch": {"operation": "MERGE", "value": {"connect_timeout": "7s"}},
}
LUA = {
    "applyTo": "HTTP_FILTER",
    "match": {
        "context": "SIDECAR_OUTBOUND",
        "listener": {
            "portNumber": 9080,
            "filterChain": {"filter": {"name": HCM, "subFilter": {"name": "envoy.filters.http.router"}}},
        },
    },
    "patch": {
        "operation": "INSERT_BEFORE",
        "value": {
            "name": "my.lua",
            "typed_config": {"@type": LUA_TYPE, "default_source_code": {"inline_string": "x"}},
        },
    },
}
ROUTE_HEADER = {
    "applyTo": "ROUTE_CONFIGURATION",
    "match": {"context": "SIDECAR_OUTBOUND", "routeConfiguration": {"portNumber": 9080}},
    "patch": {
        "operation": "MERGE",
        "value": {"response_headers_to_add": [{"header": {"key": "x-patched", "value": "yes"}}]},
    },
}
INBOUND_ROUTE = {
    "applyTo": "VIRTUAL_HOST",
    "match": {"context": "SIDECAR_INBOUND", "routeConfiguration": {"portNumber": 9080}},
    "patch": {
        "operation": "MERGE",
        "value": {"response_headers_to_add": [{"header": {"key": "x-in", "value": "1"}}]},
    },
}


def model_with(*filters: dict[str, Any]) -> Model:
    return build([*mesh_objects(), *filters])


def generate(model: Model, node: str, type_url: TypeUrl, names: set[str] | None = None) -> list[Resource]:
    proxy = model.proxy(node, {"LABELS": {"app": node.split("~")[2].split("-")[0]}})
    request = PushRequest(full=True, forced=True, reasons=Counter(), push=model.push)
    ctx = GenerationContext(proxy, model.push, model.index, request)
    watch = WatchedResource(type_url.value, frozenset(names or ()), wildcard=names is None)
    out = sidecar_generators()[type_url].generate(ctx, watch, None)
    assert out is not None
    return out


def parsed(resources: list[Resource], message_type: type[Any]) -> dict[str, Any]:
    out = {}
    for resource in resources:
        message = message_type()
        resource.message().Unpack(message)
        out[message.name] = message
    return out


def http_filters(listener: Any) -> list[str]:
    hcm = hcm_pb2.HttpConnectionManager()
    listener.filter_chains[0].filters[0].typed_config.Unpack(hcm)
    return [f.name for f in hcm.http_filters]


def test_cluster_merge_reaches_the_cds_of_selected_proxies_only() -> None:
    model = model_with(envoy_filter("timeouts", "default", [TIMEOUT], selector={"app": "productpage"}))
    mine = parsed(generate(model, CLIENT, TypeUrl.CLUSTER), cluster_pb2.Cluster)
    assert mine["outbound|9080||reviews.default.svc.cluster.local"].connect_timeout.seconds == 7
    assert mine["outbound|9080|v1|reviews.default.svc.cluster.local"].connect_timeout.seconds == 7
    assert mine["outbound|9080||ratings.other.svc.cluster.local"].connect_timeout.seconds != 7
    theirs = parsed(generate(model, REVIEWS, TypeUrl.CLUSTER), cluster_pb2.Cluster)
    assert theirs["outbound|9080||reviews.default.svc.cluster.local"].connect_timeout.seconds != 7


def test_unpatched_clusters_keep_their_bytes_and_removes_and_adds_apply() -> None:
    plain = generate(model_with(), CLIENT, TypeUrl.CLUSTER)
    remove = {
        "applyTo": "CLUSTER",
        "match": {"cluster": {"name": "outbound|6000||cache.default.svc.cluster.local"}},
        "patch": {"operation": "REMOVE"},
    }
    add = {"applyTo": "CLUSTER", "patch": {"operation": "ADD", "value": {"name": "extra", "type": "STATIC"}}}
    patched = generate(
        model_with(envoy_filter("f", "default", [TIMEOUT, remove, add])), CLIENT, TypeUrl.CLUSTER
    )
    before = {r.name: r.payload for r in plain}
    after = {r.name: r.payload for r in patched}
    assert "outbound|6000||cache.default.svc.cluster.local" not in after
    assert "extra" in after
    assert (
        after["outbound|3306||db.default.svc.cluster.local"]
        == before["outbound|3306||db.default.svc.cluster.local"]
    )
    assert (
        after["outbound|9080||reviews.default.svc.cluster.local"]
        != before["outbound|9080||reviews.default.svc.cluster.local"]
    )


def test_patched_lists_are_shared_by_proxies_of_one_scope() -> None:
    model = model_with(envoy_filter("f", "default", [TIMEOUT, LUA]))
    # Two pods of one service: the same scope, the same inbound clusters.
    first = generate(model, REVIEWS, TypeUrl.CLUSTER)
    second = generate(model, REVIEWS.replace("10.1.0.21", "10.1.0.22").replace("v1", "v2"), TypeUrl.CLUSTER)
    assert first is second


def test_a_proxy_without_filters_gets_the_unpatched_shared_list() -> None:
    model = model_with(envoy_filter("f", "other", [TIMEOUT]))
    assert model.push.envoy_filters
    plain = generate(model_with(), CLIENT, TypeUrl.CLUSTER)
    got = generate(model, CLIENT, TypeUrl.CLUSTER)
    assert [r.payload for r in got] == [r.payload for r in plain]


def test_http_filter_insert_before_the_router() -> None:
    model = model_with(envoy_filter("lua", "istio-system", [LUA]))
    listeners = parsed(generate(model, CLIENT, TypeUrl.LISTENER), listener_pb2.Listener)
    assert http_filters(listeners["0.0.0.0_9080"])[-2:] == ["my.lua", "envoy.filters.http.router"]
    # Outbound port 9080 only: the HTTP chains of virtualInbound (SIDECAR_INBOUND) are left alone.
    assert "my.lua" not in str(listeners["virtualInbound"])


def test_route_configuration_merge_in_rds_and_inline_inbound_routes_in_lds() -> None:
    model = model_with(envoy_filter("routes", "default", [ROUTE_HEADER, INBOUND_ROUTE]))
    routes = parsed(generate(model, CLIENT, TypeUrl.ROUTE, {"9080", "6000"}), route_pb2.RouteConfiguration)
    assert [h.header.key for h in routes["9080"].response_headers_to_add] == ["x-patched"]
    assert not routes["6000"].response_headers_to_add
    listeners = parsed(generate(model, CLIENT, TypeUrl.LISTENER), listener_pb2.Listener)
    inbound = listeners["virtualInbound"]
    keys = set()
    for chain in inbound.filter_chains:
        for filter_ in chain.filters:
            if filter_.name != HCM:
                continue
            hcm = hcm_pb2.HttpConnectionManager()
            filter_.typed_config.Unpack(hcm)
            for vhost in hcm.route_config.virtual_hosts:
                keys.update((hcm.route_config.name, h.header.key) for h in vhost.response_headers_to_add)
    assert keys == {("inbound|9080||", "x-in")}


def test_envoy_filter_changes_skip_eds_but_reach_the_other_types() -> None:
    request = PushRequest(full=True, configs_updated={ConfigKey(Kind.ENVOY_FILTER, "f", "default")})
    assert not EndpointGenerator().needs_push(request)
    for type_url in (TypeUrl.CLUSTER, TypeUrl.LISTENER, TypeUrl.ROUTE):
        assert sidecar_generators()[type_url].needs_push(request), type_url


def test_a_failing_patch_is_counted_and_the_rest_still_applies() -> None:
    from meshpilot.networking.envoyfilter.problems import PATCH_PROBLEMS

    wrong_type = {
        "applyTo": "HTTP_FILTER",
        "match": {
            "listener": {
                "filterChain": {"filter": {"name": HCM, "subFilter": {"name": "envoy.filters.http.router"}}}
            }
        },
        "patch": {"operation": "MERGE", "value": {"typed_config": {"@type": LUA_TYPE}}},
    }
    before = PATCH_PROBLEMS.count("EnvoyFilter", "default/broken")
    model = model_with(envoy_filter("broken", "default", [wrong_type, LUA]))
    listeners = parsed(generate(model, CLIENT, TypeUrl.LISTENER), listener_pb2.Listener)
    assert "my.lua" in http_filters(listeners["0.0.0.0_9080"])
    assert PATCH_PROBLEMS.count("EnvoyFilter", "default/broken") > before


# -- what is not applied is logged and counted ------------------------------------------------------


def test_unapplied_names_what_is_left_out() -> None:
    def of(*patches: dict[str, Any], **extra: Any) -> str | None:
        return unapplied(config_of(envoy_filter("f", "default", patches, extra=extra)))

    assert of(TIMEOUT, LUA, ROUTE_HEADER, INBOUND_ROUTE) is None
    assert "EXTENSION_CONFIG" in (
        of({"applyTo": "EXTENSION_CONFIG", "patch": {"operation": "ADD", "value": {"name": "x"}}}) or ""
    )
    assert "BOOTSTRAP" in (of({"applyTo": "BOOTSTRAP", "patch": {"operation": "MERGE", "value": {}}}) or "")
    assert "does nothing" in (
        of({"applyTo": "ROUTE_CONFIGURATION", "patch": {"operation": "ADD", "value": {}}}) or ""
    )
    assert "not a valid Cluster" in (
        of({"applyTo": "CLUSTER", "patch": {"operation": "MERGE", "value": {"connect_timeout": "soon"}}})
        or ""
    )
    assert "unknown type" in (
        of(
            {
                "applyTo": "HTTP_FILTER",
                "patch": {
                    "operation": "ADD",
                    "value": {"name": "x", "typed_config": {"@type": "type.googleapis.com/istio.nope.Nope"}},
                },
            }
        )
        or ""
    )
    assert "waypoint" in (of({**TIMEOUT, "match": {"context": "WAYPOINT"}}) or "")
    assert "targetRefs" in (
        of(TIMEOUT, targetRefs=[{"kind": "Gateway", "group": "gateway.networking.k8s.io", "name": "w"}]) or ""
    )


def test_the_gauge_counts_only_filters_with_unapplied_parts(caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    store = ConfigStore()
    store.add_handler(UnappliedConfig(registry, {Kind.ENVOY_FILTER: unapplied}).on_event)

    def count() -> float | None:
        return registry.get_sample_value("meshpilot_unapplied_config", {"kind": "EnvoyFilter"})

    bootstrap = {"applyTo": "BOOTSTRAP", "patch": {"operation": "MERGE", "value": {}}}
    with caplog.at_level(logging.WARNING, logger="meshpilot.config.unapplied"):
        store.upsert(config_of(envoy_filter("fine", "default", [TIMEOUT])))
        store.upsert(config_of(envoy_filter("boot", "default", [TIMEOUT, bootstrap])))
    assert count() == 1
    assert "EnvoyFilter default/boot is stored but not applied in full: patch 1 (BOOTSTRAP" in caplog.text
    assert "default/fine" not in caplog.text
    store.upsert(config_of(envoy_filter("boot", "default", [TIMEOUT])))
    assert count() == 0


# -- gateways ----------------------------------------------------------------------------------------

GATEWAY_NODE = "router~10.1.0.100~gw-1.istio-system~istio-system.svc.cluster.local"


def gateway_objects(*extra: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        *mesh_objects(),
        {
            **service("istio-ingressgateway", "istio-system", "10.96.1.1", [], {"istio": "ingressgateway"}),
            "spec": {
                "clusterIP": "10.96.1.1",
                "selector": {"istio": "ingressgateway"},
                # Gateway port 80 is served on 8080 in the Pod: route configuration "http.8080".
                "ports": [{"name": "http2", "port": 80, "targetPort": 8080}],
            },
        },
        pod("gw-1", "istio-system", "10.1.0.100", {"istio": "ingressgateway"}),
        istio(
            "Gateway",
            "gw",
            "default",
            {
                "selector": {"istio": "ingressgateway"},
                "servers": [{"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}],
            },
        ),
        istio(
            "VirtualService",
            "front",
            "default",
            {
                "hosts": ["front.example.com"],
                "gateways": ["gw"],
                "http": [{"route": [{"destination": {"host": "reviews"}}]}],
            },
        ),
        *extra,
    ]


def generate_gateway(model: Model, type_url: TypeUrl, names: set[str] | None = None) -> list[Resource]:
    proxy = model.proxy(GATEWAY_NODE, {"LABELS": {"istio": "ingressgateway"}})
    ctx = GenerationContext(proxy, model.push, model.index, PushRequest(full=True, push=model.push))
    watch = WatchedResource(type_url.value, frozenset(names or ()), wildcard=names is None)
    out = sidecar_generators()[type_url].generate(ctx, watch, None)
    assert out is not None
    return out


def test_gateway_patches_use_the_gateway_context_and_server_ports() -> None:
    patches = [
        {
            "applyTo": "ROUTE_CONFIGURATION",
            "match": {"context": "GATEWAY", "routeConfiguration": {"portNumber": 80}},
            "patch": {
                "operation": "MERGE",
                "value": {"response_headers_to_add": [{"header": {"key": "x-gw", "value": "1"}}]},
            },
        },
        {
            "applyTo": "CLUSTER",
            "match": {"context": "GATEWAY"},
            "patch": {"operation": "ADD", "value": {"name": "gw-extra", "type": "STATIC"}},
        },
        {
            "applyTo": "HTTP_FILTER",
            "match": {
                "context": "GATEWAY",
                "listener": {"portNumber": 8080, "filterChain": {"filter": {"name": HCM}}},
            },
            "patch": {"operation": "INSERT_FIRST", "value": LUA["patch"]["value"]},
        },
        # Sidecar patches leave the gateway alone.
        TIMEOUT,
    ]
    model = build(
        gateway_objects(envoy_filter("gw", "istio-system", patches, selector={"istio": "ingressgateway"}))
    )
    routes = parsed(generate_gateway(model, TypeUrl.ROUTE, {"http.8080"}), route_pb2.RouteConfiguration)
    assert [h.header.key for h in routes["http.8080"].response_headers_to_add] == ["x-gw"]
    found = parsed(generate_gateway(model, TypeUrl.CLUSTER), cluster_pb2.Cluster)
    assert "gw-extra" in found
    assert found["outbound|9080||reviews.default.svc.cluster.local"].connect_timeout.seconds != 7
    listeners = parsed(generate_gateway(model, TypeUrl.LISTENER), listener_pb2.Listener)
    assert http_filters(listeners["0.0.0.0_8080"])[0] == "my.lua"
    # A sidecar is not selected.
    assert "gw-extra" not in parsed(generate(model, CLIENT, TypeUrl.CLUSTER), cluster_pb2.Cluster)


def test_a_proxyless_grpc_client_selected_by_a_filter_is_counted() -> None:
    from meshpilot.networking.envoyfilter.problems import PATCH_PROBLEMS
    from meshpilot.xds.generators.grpc import GrpcListenerGenerator

    model = model_with(envoy_filter("for-grpc", "default", [TIMEOUT]))
    proxy = model.proxy(
        "sidecar~10.1.0.99~grpc-client.default~default.svc.cluster.local", {"GENERATOR": "grpc"}
    )
    ctx = GenerationContext(proxy, model.push, model.index, PushRequest(full=True, push=model.push))
    before = PATCH_PROBLEMS.count("EnvoyFilter", "default/for-grpc")
    watch = WatchedResource(TypeUrl.LISTENER.value, frozenset({"reviews.default.svc.cluster.local:9080"}))
    assert GrpcListenerGenerator().generate(ctx, watch, None)
    assert PATCH_PROBLEMS.count("EnvoyFilter", "default/for-grpc") == before + 1
