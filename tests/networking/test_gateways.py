"""Gateway proxies (``router``): listeners from Gateway servers, routes from the VirtualServices bound."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from support.kube import istio, pod, service
from support.mesh_objects import CLIENT, mesh_objects
from support.model import Model, build

from meshpilot.model.config import ConfigKey
from meshpilot.model.gateways import ServerHost, binds_gateway, served_hosts, servers_of
from meshpilot.model.kind import Kind
from meshpilot.model.push_request import PushRequest, TriggerReason
from meshpilot.networking.gateway import gateway_listeners, gateway_route_configuration
from meshpilot.networking.route import build_route_configuration
from meshpilot.xds.dependencies import proxy_needs_push

GATEWAY = "router~10.1.0.100~gw-1.istio-system~istio-system.svc.cluster.local"
GATEWAY_LABELS = {"LABELS": {"istio": "ingressgateway"}}


def _gateway_doc(name: str, namespace: str, *servers: dict[str, Any]) -> dict[str, Any]:
    return istio(
        "Gateway", name, namespace, {"selector": {"istio": "ingressgateway"}, "servers": list(servers)}
    )


def _gateway_objects(*extra: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        *mesh_objects(),
        # istio-ingressgateway: port 80 goes to 8080 in the Pod.
        {
            **service("istio-ingressgateway", "istio-system", "10.96.1.1", [], {"istio": "ingressgateway"}),
            "spec": {
                "clusterIP": "10.96.1.1",
                "selector": {"istio": "ingressgateway"},
                "ports": [{"name": "http2", "port": 80, "targetPort": 8080}],
            },
        },
        pod("gw-1", "istio-system", "10.1.0.100", {"istio": "ingressgateway"}),
        _gateway_doc(
            "bookinfo-gateway",
            "default",
            {
                "port": {"number": 80, "name": "http", "protocol": "HTTP"},
                "hosts": ["bookinfo.example.com", "*/*.shop.example.com"],
            },
            {
                "port": {"number": 443, "name": "https", "protocol": "HTTPS"},
                "hosts": ["bookinfo.example.com"],
                "tls": {"mode": "SIMPLE", "credentialName": "bookinfo-cert"},
            },
        ),
        istio(
            "VirtualService",
            "bookinfo",
            "default",
            {
                "hosts": ["bookinfo.example.com"],
                "gateways": ["bookinfo-gateway"],
                "http": [
                    {
                        "match": [{"uri": {"prefix": "/reviews"}}],
                        "route": [{"destination": {"host": "reviews"}}],
                    },
                    {"route": [{"destination": {"host": "productpage", "port": {"number": 9080}}}]},
                ],
            },
        ),
        # Bound from another namespace, by namespace/name; its host matches the wildcard server host.
        istio(
            "VirtualService",
            "shop",
            "other",
            {
                "hosts": ["cart.shop.example.com"],
                "gateways": ["default/bookinfo-gateway"],
                "http": [{"route": [{"destination": {"host": "ratings"}}]}],
            },
        ),
        # For sidecars only (no gateways): not on the gateway.
        istio(
            "VirtualService",
            "reviews-mesh",
            "default",
            {
                "hosts": ["reviews"],
                "http": [{"route": [{"destination": {"host": "reviews", "subset": "v2"}}]}],
            },
        ),
        *extra,
    ]


@pytest.fixture
def gateway_model() -> Model:
    return build(_gateway_objects())


def _hcm(listener: Any) -> Any:
    [chain] = listener.filter_chains
    [hcm] = chain.filters
    out = hcm_pb2.HttpConnectionManager()
    hcm.typed_config.Unpack(out)
    return out


def _named(listeners: list[Any], name: str) -> Any:
    return next(li for li in listeners if li.name == name)


def test_a_plaintext_server_is_a_listener_on_the_pods_port_fetching_http_dot_that_port(
    gateway_model: Model,
) -> None:
    proxy = gateway_model.proxy(GATEWAY, GATEWAY_LABELS)
    listener = _named(gateway_listeners(proxy, gateway_model.push), "0.0.0.0_8080")
    assert listener.address.socket_address.address == "0.0.0.0"
    assert listener.address.socket_address.port_value == 8080
    hcm = _hcm(listener)
    # istiod names the route configuration after the port the Pod listens on, not the Gateway port.
    assert hcm.rds.route_config_name == "http.8080"
    assert hcm.use_remote_address.value is True
    assert hcm.http_filters[-1].name == "envoy.filters.http.router"


def test_routes_hold_the_bound_virtual_services_hosts_only(gateway_model: Model) -> None:
    proxy = gateway_model.proxy(GATEWAY, GATEWAY_LABELS)
    config = gateway_route_configuration(proxy, gateway_model.push, "http.8080")
    assert config.name == "http.8080"
    vhosts = {v.name: v for v in config.virtual_hosts}
    assert sorted(vhosts) == ["bookinfo.example.com:80", "cart.shop.example.com:80"]
    bookinfo = vhosts["bookinfo.example.com:80"]
    # The host alone: the route configuration ignores the port in the Host header.
    assert list(bookinfo.domains) == ["bookinfo.example.com"]
    assert config.ignore_port_in_host_matching
    assert [r.route.cluster for r in bookinfo.routes] == [
        "outbound|9080||reviews.default.svc.cluster.local",
        "outbound|9080||productpage.default.svc.cluster.local",
    ]
    assert bookinfo.routes[0].match.prefix == "/reviews"
    [cart] = vhosts["cart.shop.example.com:80"].routes
    # "ratings" is resolved in the VirtualService's namespace.
    assert cart.route.cluster == "outbound|9080||ratings.other.svc.cluster.local"


def test_a_route_name_no_server_has_is_empty_and_a_server_without_virtual_services_answers_404() -> None:
    model = build(
        _gateway_objects(
            _gateway_doc(
                "empty",
                "istio-system",
                {"port": {"number": 81, "name": "http-81", "protocol": "HTTP"}, "hosts": ["*"]},
            )
        )
    )
    proxy = model.proxy(GATEWAY, GATEWAY_LABELS)
    assert list(gateway_route_configuration(proxy, model.push, "http.82").virtual_hosts) == []
    [blackhole] = gateway_route_configuration(proxy, model.push, "http.81").virtual_hosts
    assert list(blackhole.domains) == ["*"]
    assert blackhole.routes[0].direct_response.status == 404
    assert sorted(li.name for li in gateway_listeners(proxy, model.push)) == [
        "0.0.0.0_443",
        "0.0.0.0_8080",
        "0.0.0.0_81",
    ]


def test_a_router_the_selector_does_not_match_has_no_listeners(gateway_model: Model) -> None:
    egress = "router~10.1.0.200~egress-1.istio-system~istio-system.svc.cluster.local"
    proxy = gateway_model.proxy(egress, {"LABELS": {"istio": "egressgateway"}})
    assert gateway_listeners(proxy, gateway_model.push) == []


def test_sidecars_keep_their_own_routes(gateway_model: Model) -> None:
    config = build_route_configuration(gateway_model.proxy(CLIENT), gateway_model.push, "9080")
    names = [v.name for v in config.virtual_hosts]
    assert "bookinfo.example.com:9080" not in names
    [reviews] = [v for v in config.virtual_hosts if v.name == "reviews.default.svc.cluster.local:9080"]
    assert reviews.routes[0].route.cluster == "outbound|9080|v2|reviews.default.svc.cluster.local"


def test_https_redirect_requires_tls_on_the_virtual_host() -> None:
    redirecting = _gateway_doc(
        "redirect",
        "default",
        {
            "port": {"number": 8000, "name": "http-8000", "protocol": "HTTP"},
            "hosts": ["secure.example.com"],
            "tls": {"httpsRedirect": True},
        },
    )
    bound = istio(
        "VirtualService",
        "secure",
        "default",
        {
            "hosts": ["secure.example.com"],
            "gateways": ["redirect"],
            "http": [{"route": [{"destination": {"host": "reviews"}}]}],
        },
    )
    model = build(_gateway_objects(redirecting, bound))
    proxy = model.proxy(GATEWAY, GATEWAY_LABELS)
    [vhost] = gateway_route_configuration(proxy, model.push, "http.8000").virtual_hosts
    assert vhost.require_tls == vhost.ALL


def test_binding_by_name_namespace_and_fqdn() -> None:
    gw = ConfigKey(Kind.GATEWAY, "ingress", "istio-system")
    assert binds_gateway("istio-system", ["ingress"], gw, "cluster.local")
    assert not binds_gateway("default", ["ingress"], gw, "cluster.local")
    assert binds_gateway("default", ["istio-system/ingress"], gw, "cluster.local")
    assert binds_gateway("default", ["ingress.istio-system.svc.cluster.local"], gw, "cluster.local")
    assert not binds_gateway("default", ["mesh"], gw, "cluster.local")


def test_server_hosts_admit_namespaces_and_narrow_wildcards() -> None:
    model = build(_gateway_objects())
    [config] = [c for c in model.push.configs(Kind.GATEWAY) if c.name == "bookinfo-gateway"]
    http = servers_of(config)[0]
    assert http.hosts == (ServerHost("*", "bookinfo.example.com"), ServerHost("*", "*.shop.example.com"))
    assert served_hosts("a.shop.example.com", "x", http) == ["a.shop.example.com"]
    # A wider VirtualService host is served as each of the server's narrower ones.
    assert served_hosts("*.example.com", "x", http) == ["bookinfo.example.com", "*.shop.example.com"]
    assert served_hosts("other.example.org", "x", http) == []
    dotted = istio(
        "Gateway",
        "own",
        "team",
        {
            "selector": {},
            "servers": [{"port": {"number": 80, "name": "h", "protocol": "HTTP"}, "hosts": ["./a.com"]}],
        },
    )
    own = servers_of(build([dotted]).push.configs(Kind.GATEWAY)[0])[0]
    assert served_hosts("a.com", "team", own) == ["a.com"]
    assert served_hosts("a.com", "elsewhere", own) == []


def test_gateway_and_virtual_service_changes_push_routers_not_sidecars(gateway_model: Model) -> None:
    router = gateway_model.proxy(GATEWAY, GATEWAY_LABELS)
    sidecar = gateway_model.proxy(CLIENT)
    root = gateway_model.push.mesh.root_namespace

    def change(kind: Kind, name: str, namespace: str) -> PushRequest:
        return PushRequest(
            full=True,
            configs_updated=frozenset({ConfigKey(kind, name, namespace)}),
            reasons=Counter({TriggerReason.CONFIG: 1}),
        )

    gateway_change = change(Kind.GATEWAY, "bookinfo-gateway", "default")
    assert proxy_needs_push(router, gateway_change, root)
    assert not proxy_needs_push(sidecar, gateway_change, root)
    assert proxy_needs_push(router, change(Kind.VIRTUAL_SERVICE, "shop", "other"), root)


def test_matches_naming_gateways_apply_only_where_they_say() -> None:
    both = istio(
        "VirtualService",
        "ratings-both",
        "other",
        {
            "hosts": ["ratings.other.svc.cluster.local", "ratings.example.com"],
            "gateways": ["mesh", "default/bookinfo-gateway"],
            "http": [
                {
                    "match": [{"uri": {"prefix": "/edge"}, "gateways": ["default/bookinfo-gateway"]}],
                    "route": [{"destination": {"host": "reviews.default.svc.cluster.local"}}],
                },
                {
                    "match": [{"uri": {"prefix": "/inside"}, "gateways": ["mesh"]}],
                    "route": [{"destination": {"host": "productpage.default.svc.cluster.local"}}],
                },
                {"route": [{"destination": {"host": "ratings"}}]},
            ],
        },
    )
    listed = _gateway_doc(
        "bookinfo-gateway",
        "default",
        {
            "port": {"number": 80, "name": "http", "protocol": "HTTP"},
            "hosts": ["*/ratings.example.com"],
        },
    )
    docs = [d for d in _gateway_objects(both) if d["metadata"].get("name") != "bookinfo-gateway"] + [listed]
    model = build(docs)
    router = model.proxy(GATEWAY, GATEWAY_LABELS)
    [vhost] = gateway_route_configuration(router, model.push, "http.8080").virtual_hosts
    assert [r.match.prefix for r in vhost.routes] == ["/edge", "/"]

    sidecar_routes = build_route_configuration(model.proxy(CLIENT), model.push, "9080")
    [ratings] = [v for v in sidecar_routes.virtual_hosts if v.name == "ratings.other.svc.cluster.local:9080"]
    assert [r.match.prefix for r in ratings.routes] == ["/inside", "/"]


def _tcp_proxy(chain: Any) -> Any:
    out = tcp_proxy_pb2.TcpProxy()
    chain.filters[-1].typed_config.Unpack(out)
    return out


def test_tls_passthrough_and_tcp_servers_route_by_sni_and_port() -> None:
    servers = _gateway_doc(
        "l4",
        "default",
        {
            "port": {"number": 443, "name": "tls", "protocol": "TLS"},
            "hosts": ["*.example.com"],
            "tls": {"mode": "PASSTHROUGH"},
        },
        {"port": {"number": 3306, "name": "tcp", "protocol": "TCP"}, "hosts": ["*"]},
        {
            "port": {"number": 8443, "name": "https", "protocol": "HTTPS"},
            "hosts": ["*"],
            "tls": {"mode": "SIMPLE", "credentialName": "cert"},
        },
    )
    routes = istio(
        "VirtualService",
        "l4",
        "default",
        {
            "hosts": ["*.example.com", "*.example.org", "db.internal"],
            "gateways": ["l4"],
            "tls": [
                {
                    "match": [{"port": 443, "sniHosts": ["a.example.com"]}],
                    "route": [{"destination": {"host": "reviews", "subset": "v1"}}],
                },
                {
                    "match": [{"port": 443, "sniHosts": ["b.example.com", "c.example.org"]}],
                    "route": [{"destination": {"host": "ratings.other.svc.cluster.local"}}],
                },
            ],
            "tcp": [
                {
                    "match": [{"port": 3306}],
                    "route": [{"destination": {"host": "db", "port": {"number": 3306}}}],
                }
            ],
        },
    )
    model = build(_gateway_objects(servers, routes))
    proxy = model.proxy(GATEWAY, GATEWAY_LABELS)
    listeners = {li.name: li for li in gateway_listeners(proxy, model.push)}
    # 8443 terminates TLS with a certificate from a Secret (see test_gateway_tls.py).
    assert sorted(listeners) == ["0.0.0.0_3306", "0.0.0.0_443", "0.0.0.0_8080", "0.0.0.0_8443"]
    tls = listeners["0.0.0.0_443"]
    assert [f.name for f in tls.listener_filters] == ["envoy.filters.listener.tls_inspector"]
    # The port also serves bookinfo's HTTPS server (terminated, with its own chain); passthrough ones:
    by_sni = {
        tuple(c.filter_chain_match.server_names): _tcp_proxy(c).cluster
        for c in tls.filter_chains
        if not c.HasField("transport_socket")
    }
    # c.example.org is outside the server's hosts.
    assert by_sni == {
        ("a.example.com",): "outbound|9080|v1|reviews.default.svc.cluster.local",
        ("b.example.com",): "outbound|9080||ratings.other.svc.cluster.local",
    }
    [tcp] = listeners["0.0.0.0_3306"].filter_chains
    assert _tcp_proxy(tcp).cluster == "outbound|3306||db.default.svc.cluster.local"


def test_a_server_bound_to_a_unix_socket_listens_on_it() -> None:
    socket_server = {
        "port": {"number": 0, "name": "http-uds", "protocol": "HTTP"},
        "hosts": ["*"],
        "bind": "unix:///var/run/gw.sock",
    }
    model = build(_gateway_objects(_gateway_doc("uds", "default", socket_server)))
    proxy = model.proxy(GATEWAY, GATEWAY_LABELS)
    [uds] = [li for li in gateway_listeners(proxy, model.push) if li.name.startswith("unix://")]
    assert uds.name == "unix:///var/run/gw.sock_0"
    assert uds.address.pipe.path == "/var/run/gw.sock"
    assert _hcm(uds).rds.route_config_name == "http.0.unix:///var/run/gw.sock"


def test_domains_are_the_hosts_alone_wildcards_included() -> None:
    server = {"port": {"number": 8088, "name": "http-8088", "protocol": "HTTP"}, "hosts": ["*"]}

    def bound(name: str, host: str) -> dict[str, Any]:
        http = [{"route": [{"destination": {"host": "reviews"}}]}]
        return istio("VirtualService", name, "default", {"hosts": [host], "gateways": ["any"], "http": http})

    wild = [bound("wild", "*.wild.example.com"), bound("all", "*")]
    model = build(_gateway_objects(_gateway_doc("any", "default", server), *wild))
    proxy = model.proxy(GATEWAY, GATEWAY_LABELS)
    vhosts = {
        v.name: list(v.domains)
        for v in gateway_route_configuration(proxy, model.push, "http.8088").virtual_hosts
    }
    assert vhosts == {"*.wild.example.com:8088": ["*.wild.example.com"], "*:8088": ["*"]}


def test_a_wildcard_virtual_service_host_is_served_as_every_narrower_server_host() -> None:
    server = {
        "port": {"number": 8090, "name": "http-8090", "protocol": "HTTP"},
        "hosts": ["a.foo.com", "b.foo.com"],
    }
    wild = istio(
        "VirtualService",
        "foo",
        "default",
        {
            "hosts": ["*.foo.com"],
            "gateways": ["foo"],
            "http": [{"route": [{"destination": {"host": "reviews"}}]}],
        },
    )
    model = build(_gateway_objects(_gateway_doc("foo", "default", server), wild))
    proxy = model.proxy(GATEWAY, GATEWAY_LABELS)
    config = gateway_route_configuration(proxy, model.push, "http.8090")
    # Both hosts have the VirtualService's routes, so they share one virtual host (istiod's route
    # collapse), named after the first in istiod's host order.
    [vhost] = config.virtual_hosts
    assert vhost.name == "a.foo.com:8090"
    assert list(vhost.domains) == ["a.foo.com", "b.foo.com"]


def test_hosts_with_different_routes_keep_their_own_virtual_hosts(gateway_model: Model) -> None:
    proxy = gateway_model.proxy(GATEWAY, GATEWAY_LABELS)
    config = gateway_route_configuration(proxy, gateway_model.push, "http.8080")
    assert all(len(v.domains) == 1 for v in config.virtual_hosts)


def test_an_authorization_policy_selecting_the_gateway_puts_rbac_on_its_listeners() -> None:
    # A DENY on /admin for the ingress gateway's workload (in its own namespace, by its labels).
    deny = istio(
        "AuthorizationPolicy",
        "no-admin",
        "istio-system",
        {
            "selector": {"matchLabels": {"istio": "ingressgateway"}},
            "action": "DENY",
            "rules": [{"to": [{"operation": {"paths": ["/admin/*"]}}]}],
        },
        group="security",
    )
    model = build(_gateway_objects(deny))
    proxy = model.proxy(GATEWAY, GATEWAY_LABELS)
    listener = _named(gateway_listeners(proxy, model.push), "0.0.0.0_8080")
    names = [f.name for f in _hcm(listener).http_filters]
    assert "envoy.filters.http.rbac" in names
    assert names.index("envoy.filters.http.rbac") < names.index("envoy.filters.http.router")
    # Without the policy, the same gateway has no RBAC filter.
    plain_model = build(_gateway_objects())
    plain = _named(
        gateway_listeners(plain_model.proxy(GATEWAY, GATEWAY_LABELS), plain_model.push), "0.0.0.0_8080"
    )
    assert "envoy.filters.http.rbac" not in [f.name for f in _hcm(plain).http_filters]
