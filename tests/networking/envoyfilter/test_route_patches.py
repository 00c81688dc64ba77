"""ROUTE_CONFIGURATION, VIRTUAL_HOST and HTTP_ROUTE patches as istiod applies them."""

from __future__ import annotations

from typing import Any

from envoy.config.route.v3 import route_pb2
from support.envoy_filters import as_dict, message, patch_set

from meshpilot.networking.envoyfilter import routes
from meshpilot.networking.envoyfilter.patches import Context

OUT, IN, GW = Context.SIDECAR_OUTBOUND, Context.SIDECAR_INBOUND, Context.GATEWAY


def route_configuration(name: str = "9080") -> Any:
    return message(
        route_pb2.RouteConfiguration,
        {
            "name": name,
            "virtual_hosts": [
                {
                    "name": "reviews.default.svc.cluster.local:9080",
                    "domains": ["reviews.default.svc.cluster.local", "reviews"],
                    "routes": [
                        {"name": "first", "match": {"prefix": "/a"}, "route": {"cluster": "a"}},
                        {"name": "second", "match": {"prefix": "/b"}, "redirect": {"path_redirect": "/x"}},
                        {"name": "default", "match": {"prefix": "/"}, "route": {"cluster": "c"}},
                    ],
                },
                {
                    "name": "allow_any",
                    "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "p"}}],
                },
            ],
        },
    )


def run(config: Any, *patches: dict[str, Any], context: int = OUT, port_map: Any = None) -> Any:
    routes.patch_route_configuration(config, patch_set(*patches), context, port_map)
    return config


def patch(apply_to: str, operation: str, value: Any = None, **route_configuration: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"applyTo": apply_to, "patch": {"operation": operation}}
    if value is not None:
        out["patch"]["value"] = value
    if route_configuration:
        out["match"] = {"routeConfiguration": route_configuration}
    return out


def route_names(config: Any, vhost: int = 0) -> list[str]:
    return [r.name for r in config.virtual_hosts[vhost].routes]


def test_route_configuration_merge_by_name_and_port() -> None:
    value = {"request_headers_to_add": [{"header": {"key": "x-a", "value": "1"}}]}
    assert (
        len(
            run(
                route_configuration(), patch("ROUTE_CONFIGURATION", "MERGE", value, portNumber=9080)
            ).request_headers_to_add
        )
        == 1
    )
    assert not run(
        route_configuration(), patch("ROUTE_CONFIGURATION", "MERGE", value, portNumber=80)
    ).request_headers_to_add
    assert run(
        route_configuration(), patch("ROUTE_CONFIGURATION", "MERGE", value, name="9080")
    ).request_headers_to_add
    # A host:port name has no port to match; an inbound one does.
    assert not routes.touches(
        "reviews:9080", patch_set(patch("ROUTE_CONFIGURATION", "MERGE", value, portNumber=9080)), OUT
    )
    assert routes.touches(
        "inbound|9080||", patch_set(patch("ROUTE_CONFIGURATION", "MERGE", value, portNumber=9080)), IN
    )


def test_gateway_route_names_give_port_name_and_gateway() -> None:
    value = {"request_headers_to_add": [{"header": {"key": "x-a", "value": "1"}}]}
    name = "https.443.https-main.main-gw.istio-system"

    def merged(**match: Any) -> bool:
        config = run(
            route_configuration(name), patch("ROUTE_CONFIGURATION", "MERGE", value, **match), context=GW
        )
        return len(config.request_headers_to_add) == 1

    assert merged(portName="https-main", gateway="istio-system/main-gw", portNumber=443)
    assert not merged(portName="other")
    assert not merged(gateway="istio-system/other")
    # A Gateway server port that the listen port serves (a Service port mapped to targetPort 8443).
    plain = "http.8080"
    ports = {8080: {80}}
    config = run(
        route_configuration(plain),
        patch("ROUTE_CONFIGURATION", "MERGE", value, portNumber=80),
        context=GW,
        port_map=ports,
    )
    assert config.request_headers_to_add
    config = run(
        route_configuration(plain),
        patch("ROUTE_CONFIGURATION", "MERGE", value, portNumber=8080),
        context=GW,
        port_map=ports,
    )
    assert not config.request_headers_to_add


def test_virtual_host_merge_replace_remove_and_add() -> None:
    vhost = {"name": "reviews.default.svc.cluster.local:9080"}
    config = run(
        route_configuration(),
        patch("VIRTUAL_HOST", "MERGE", {"include_request_attempt_count": True}, vhost=vhost),
    )
    assert config.virtual_hosts[0].include_request_attempt_count
    assert not config.virtual_hosts[1].include_request_attempt_count
    config = run(route_configuration(), patch("VIRTUAL_HOST", "REMOVE", vhost={"domainName": "reviews"}))
    assert [v.name for v in config.virtual_hosts] == ["allow_any"]
    config = run(
        route_configuration(),
        patch("VIRTUAL_HOST", "REPLACE", {"name": "new", "domains": ["new"]}, vhost=vhost),
    )
    assert [v.name for v in config.virtual_hosts] == ["new", "allow_any"]
    config = run(route_configuration(), patch("VIRTUAL_HOST", "ADD", {"name": "added", "domains": ["added"]}))
    assert [v.name for v in config.virtual_hosts][-1] == "added"


def test_http_route_merge_and_remove_by_name_and_action() -> None:
    vhost = {"name": "reviews.default.svc.cluster.local:9080"}
    config = run(
        route_configuration(),
        patch(
            "HTTP_ROUTE", "MERGE", {"route": {"timeout": "3s"}}, vhost={**vhost, "route": {"name": "first"}}
        ),
    )
    assert as_dict(config.virtual_hosts[0].routes[0])["route"] == {"cluster": "a", "timeout": "3s"}
    config = run(
        route_configuration(), patch("HTTP_ROUTE", "REMOVE", vhost={**vhost, "route": {"action": "REDIRECT"}})
    )
    assert route_names(config) == ["first", "default"]
    config = run(
        route_configuration(), patch("HTTP_ROUTE", "REMOVE", vhost={**vhost, "route": {"action": "ROUTE"}})
    )
    assert route_names(config) == ["second"]


def test_http_route_inserts() -> None:
    vhost = {"name": "reviews.default.svc.cluster.local:9080"}
    new = {"name": "new", "match": {"prefix": "/new"}, "direct_response": {"status": 200}}
    at_first = {**vhost, "route": {"name": "second"}}
    assert route_names(
        run(route_configuration(), patch("HTTP_ROUTE", "INSERT_BEFORE", new, vhost=at_first))
    ) == ["first", "new", "second", "default"]
    assert route_names(
        run(route_configuration(), patch("HTTP_ROUTE", "INSERT_AFTER", new, vhost=at_first))
    ) == ["first", "second", "new", "default"]
    assert route_names(
        run(route_configuration(), patch("HTTP_ROUTE", "INSERT_FIRST", new, vhost=at_first))
    ) == ["new", "first", "second", "default"]
    missing = {**vhost, "route": {"name": "nope"}}
    assert route_names(
        run(route_configuration(), patch("HTTP_ROUTE", "INSERT_FIRST", new, vhost=missing))
    ) == ["first", "second", "default"]
    assert route_names(
        run(route_configuration(), patch("HTTP_ROUTE", "INSERT_BEFORE", new, vhost=vhost))
    ) == ["new", "first", "second", "default"]
    assert route_names(run(route_configuration(), patch("HTTP_ROUTE", "ADD", new, vhost=vhost))) == [
        "first",
        "second",
        "default",
        "new",
    ]
    # Every virtual host takes a route patch without a virtual host match.
    config = run(route_configuration(), patch("HTTP_ROUTE", "ADD", new))
    assert route_names(config, 1) == ["", "new"]
