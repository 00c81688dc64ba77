"""RDS for a sidecar: virtual hosts, their domains, default and VirtualService routes."""

from __future__ import annotations

from typing import Any

from support.kube import istio
from support.mesh_objects import CLIENT, mesh_objects
from support.model import Model, build

from meshpilot.networking.route import build_route_configuration
from meshpilot.networking.vhosts_py import alt_hosts


def routes(model: Model, name: str, node: str = CLIENT) -> Any:
    return build_route_configuration(model.proxy(node), model.push, name)


def vhosts(config: Any) -> dict[str, Any]:
    return {v.name: v for v in config.virtual_hosts}


def test_route_configuration_for_a_port(model: Model) -> None:
    config = routes(model, "9080")
    assert config.name == "9080"
    assert [v.name for v in config.virtual_hosts] == [
        "productpage.default.svc.cluster.local:9080",
        "ratings.other.svc.cluster.local:9080",
        "reviews.default.svc.cluster.local:9080",
        "allow_any",
    ]
    assert config.validate_clusters.value is False
    assert config.ignore_port_in_host_matching is True
    assert config.max_direct_response_body_size_bytes.value == 1048576
    reviews = vhosts(config)["reviews.default.svc.cluster.local:9080"]
    assert list(reviews.domains) == [
        "reviews.default.svc.cluster.local",
        "reviews.default.svc.cluster.local.",
        "reviews",
        "reviews.default.svc",
        "reviews.default",
        "10.96.0.20",
    ]
    ratings = vhosts(config)["ratings.other.svc.cluster.local:9080"]
    assert list(ratings.domains) == [
        "ratings.other.svc.cluster.local",
        "ratings.other.svc.cluster.local.",
        "ratings.other",
        "ratings.other.svc",
        "10.96.0.30",
    ]
    [route] = reviews.routes
    assert route.name == "default"
    assert route.route.cluster == "outbound|9080||reviews.default.svc.cluster.local"
    assert route.route.timeout.ToSeconds() == 0
    assert route.route.retry_policy.num_retries.value == 2
    assert (
        route.route.retry_policy.retry_on
        == "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
    )
    assert [p.name for p in route.route.retry_policy.retry_host_predicate] == [
        "envoy.retry_host_predicates.previous_hosts"
    ]
    assert route.decorator.operation == "reviews.default.svc.cluster.local:9080/*"
    catch_all = config.virtual_hosts[-1]
    assert list(catch_all.domains) == ["*"] and catch_all.routes[0].route.cluster == "PassthroughCluster"


def test_registry_only_catch_all_is_block_all() -> None:
    model = build(mesh_objects(), mesh_yaml="outboundTrafficPolicy: {mode: REGISTRY_ONLY}")
    catch_all = routes(model, "9080").virtual_hosts[-1]
    assert catch_all.name == "block_all"
    assert catch_all.routes[0].direct_response.status == 502


def test_sniffed_route_name_serves_only_its_service(model: Model) -> None:
    config = routes(model, "cache.default.svc.cluster.local:6000")
    [vhost] = config.virtual_hosts
    assert vhost.name == "cache.default.svc.cluster.local:6000"
    assert list(vhost.domains) == ["*"]


def test_unknown_route_names_get_an_empty_configuration(model: Model) -> None:
    assert not routes(model, "not-a-route").virtual_hosts


def test_virtual_service_routes() -> None:
    vs = istio(
        "VirtualService",
        "reviews",
        "default",
        {
            "hosts": ["reviews"],
            "http": [
                {
                    "name": "jason",
                    "match": [{"headers": {"end-user": {"exact": "jason"}}, "uri": {"prefix": "/api"}}],
                    "route": [{"destination": {"host": "reviews", "subset": "v2"}}],
                    "timeout": "3s",
                    "retries": {"attempts": 4, "perTryTimeout": "1s", "retryOn": "5xx,503"},
                },
                {
                    "route": [
                        {"destination": {"host": "reviews", "subset": "v1"}, "weight": 80},
                        {"destination": {"host": "ratings.other.svc.cluster.local"}, "weight": 20},
                    ]
                },
                {"route": [{"destination": {"host": "never"}}]},
            ],
        },
    )
    config = routes(build([*mesh_objects(), vs]), "9080")
    reviews = vhosts(config)["reviews.default.svc.cluster.local:9080"]
    assert [r.name for r in reviews.routes] == ["jason", ""], "routes after the catch-all are dropped"
    first, second = reviews.routes
    assert first.match.prefix == "/api"
    assert first.match.case_sensitive.value is True
    assert [(h.name, h.string_match.exact) for h in first.match.headers] == [("end-user", "jason")]
    assert first.route.cluster == "outbound|9080|v2|reviews.default.svc.cluster.local"
    assert first.route.timeout.seconds == 3
    assert first.route.retry_policy.num_retries.value == 4
    assert first.route.retry_policy.retry_on == "5xx,retriable-status-codes"
    assert list(first.route.retry_policy.retriable_status_codes) == [503]
    assert first.route.retry_policy.per_try_timeout.seconds == 1
    assert first.decorator.operation == "reviews.default.svc.cluster.local:9080/api*"
    weights = [(c.name, c.weight.value) for c in second.route.weighted_clusters.clusters]
    assert weights == [
        ("outbound|9080|v1|reviews.default.svc.cluster.local", 80),
        ("outbound|9080||ratings.other.svc.cluster.local", 20),
    ]
    assert second.decorator.operation == "reviews:9080/*"
    metadata = first.metadata.filter_metadata["istio"]["config"]
    assert metadata == "/apis/networking.istio.io/v1/namespaces/default/virtual-service/reviews"


def test_alt_hosts() -> None:
    assert alt_hosts("a.ns.svc.cluster.local", "ns.svc.cluster.local") == [
        "a.ns.svc.cluster.local.",
        "a",
        "a.ns.svc",
        "a.ns",
    ]
    assert alt_hosts("a.other.svc.cluster.local", "ns.svc.cluster.local") == [
        "a.other.svc.cluster.local.",
        "a.other",
        "a.other.svc",
    ]
    assert alt_hosts("api.example.com", "ns.svc.cluster.local") == ["api.example.com."]
    assert alt_hosts("10.0.0.1", "ns.svc.cluster.local") == []
    assert alt_hosts("foo.local.campus.net", "local.campus.net") == ["foo.local.campus.net.", "foo"]


def test_only_headless_kubernetes_services_get_wildcard_domains() -> None:
    model = build(
        [
            *mesh_objects(),
            istio(
                "ServiceEntry",
                "passthrough",
                "default",
                {
                    "hosts": ["legacy.example.com"],
                    "location": "MESH_EXTERNAL",
                    "resolution": "NONE",
                    "ports": [{"number": 5000, "name": "http", "protocol": "HTTP"}],
                },
            ),
        ]
    )
    proxy = model.proxy(CLIENT)
    hosts = {
        v.name: list(v.domains) for v in build_route_configuration(proxy, model.push, "5000").virtual_hosts
    }
    assert hosts["legacy.example.com:5000"] == ["legacy.example.com", "legacy.example.com."]
