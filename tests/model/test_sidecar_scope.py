"""SidecarScope: which services, VirtualServices and DestinationRules a sidecar sees, as istiod decides."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from support.kube import istio, pod, service
from support.model import Model, build

from meshpilot._proto.istio.networking.v1alpha3 import destination_rule_pb2
from meshpilot.model import sidecar_scope
from meshpilot.model.config import ConfigKey
from meshpilot.model.egress_imports import parse_egress_hosts
from meshpilot.model.kind import Kind
from meshpilot.model.mesh import ALLOW_ANY, REGISTRY_ONLY
from meshpilot.model.proxy import Proxy
from meshpilot.model.push_context import PushContext
from meshpilot.model.service import Registry
from meshpilot.model.sidecar_scope import DEFAULT_SCOPE_NAME, SidecarScope, build_scope

SUFFIX = "svc.cluster.local"


def fqdn(name: str, namespace: str) -> str:
    return f"{name}.{namespace}.{SUFFIX}"


def svc(name: str, namespace: str, ip: str, *ports: int, annotations: dict[str, str] | None = None) -> Any:
    obj = service(name, namespace, ip, [(f"http-{p}", p) for p in ports or (80,)], {"app": name})
    if annotations:
        obj["metadata"]["annotations"] = annotations
    return obj


def service_entry(name: str, namespace: str, hosts: list[str], **extra: Any) -> Any:
    spec = {
        "hosts": hosts,
        "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
        "resolution": "NONE" if any(h.startswith("*") for h in hosts) else "DNS",
        "location": "MESH_EXTERNAL",
        **extra,
    }
    return istio("ServiceEntry", name, namespace, spec)


def sidecar(name: str, namespace: str, hosts: list[str], **extra: Any) -> Any:
    return istio("Sidecar", name, namespace, {"egress": [{"hosts": hosts}], **extra})


def base() -> list[Any]:
    return [
        svc("frontend", "shop", "10.0.0.1"),
        svc("cart", "shop", "10.0.0.2"),
        svc("billing", "pay", "10.0.1.1"),
        svc("ledger", "pay", "10.0.1.2"),
        svc("search", "tools", "10.0.2.1"),
        pod("frontend-1", "shop", "10.1.0.1", {"app": "frontend"}),
        pod("cart-1", "shop", "10.1.0.2", {"app": "cart"}),
        pod("billing-1", "pay", "10.1.1.1", {"app": "billing"}),
    ]


def proxy_in(model: Model, pod_name: str, namespace: str, ip: str) -> Proxy:
    return model.proxy(f"sidecar~{ip}~{pod_name}.{namespace}~{namespace}.{SUFFIX}")


def scope_of(
    docs: list[Any], pod_name: str = "frontend-1", ns: str = "shop", mesh: str | None = None
) -> SidecarScope:
    model = build(docs, mesh)
    ip = {"frontend-1": "10.1.0.1", "cart-1": "10.1.0.2", "billing-1": "10.1.1.1"}[pod_name]
    scope = proxy_in(model, pod_name, ns, ip).sidecar_scope
    assert scope is not None
    return scope


def hosts(scope: SidecarScope) -> set[str]:
    return {s.hostname for s in scope.services}


ALL = {
    fqdn("frontend", "shop"),
    fqdn("cart", "shop"),
    fqdn("billing", "pay"),
    fqdn("ledger", "pay"),
    fqdn("search", "tools"),
}


# -- egress hosts ------------------------------------------------------------------------


def test_without_a_sidecar_every_public_service_is_imported() -> None:
    scope = scope_of(base())
    assert scope.name == DEFAULT_SCOPE_NAME
    assert hosts(scope) == ALL
    assert scope.outbound_traffic_policy == ALLOW_ANY


def test_dot_imports_the_proxy_namespace_only() -> None:
    scope = scope_of([*base(), sidecar("default", "shop", ["./*"])])
    assert hosts(scope) == {fqdn("frontend", "shop"), fqdn("cart", "shop")}


def test_namespace_wildcard_and_wildcard_namespace_with_a_host() -> None:
    scope = scope_of([*base(), sidecar("default", "shop", ["pay/*", f"*/{fqdn('search', 'tools')}"])])
    assert hosts(scope) == {fqdn("billing", "pay"), fqdn("ledger", "pay"), fqdn("search", "tools")}


def test_a_host_in_the_wrong_namespace_imports_nothing() -> None:
    scope = scope_of([*base(), sidecar("default", "shop", [f"tools/{fqdn('billing', 'pay')}"])])
    assert hosts(scope) == set()


def test_tilde_imports_nothing() -> None:
    scope = scope_of([*base(), sidecar("default", "shop", ["~/*"])])
    assert hosts(scope) == set()
    assert scope.services == []


def test_star_star_imports_everything() -> None:
    assert hosts(scope_of([*base(), sidecar("default", "shop", ["*/*"])])) == ALL


def test_wildcard_hosts_import_services_within_them_only() -> None:
    docs = [
        *base(),
        service_entry("wild", "ext", ["*.example.com"]),
        service_entry("api", "ext", ["api.example.com"]),
        service_entry("deep", "ext", ["a.b.example.com"]),
    ]
    # An exact import does not pull in a wildcard service that contains it.
    scope = scope_of([*docs, sidecar("default", "shop", ["ext/api.example.com"])])
    assert hosts(scope) == {"api.example.com"}
    # A wildcard import pulls in every service within it, wildcard ones included.
    scope = scope_of([*docs, sidecar("default", "shop", ["ext/*.example.com"])])
    assert hosts(scope) == {"*.example.com", "api.example.com", "a.b.example.com"}
    scope = scope_of([*docs, sidecar("default", "shop", ["*/*.b.example.com"])])
    assert hosts(scope) == {"a.b.example.com"}


def test_malformed_hosts_are_ignored() -> None:
    assert parse_egress_hosts(["noslash", "a/b/c", "./x.com"], "shop").keys() == {"shop"}


def test_an_egress_port_cuts_services_to_that_port() -> None:
    docs = [
        svc("multi", "shop", "10.0.0.9", 80, 8080),
        svc("other", "shop", "10.0.0.8", 9090),
        istio(
            "Sidecar",
            "default",
            "shop",
            {"egress": [{"port": {"number": 8080, "protocol": "HTTP", "name": "web"}, "hosts": ["./*"]}]},
        ),
        pod("frontend-1", "shop", "10.1.0.1", {"app": "frontend"}),
    ]
    scope = scope_of(docs)
    [listener] = scope.egress
    assert [(s.hostname, [p.port for p in s.ports]) for s in listener.services] == [
        (fqdn("multi", "shop"), [8080])
    ]
    assert [[p.port for p in s.ports] for s in scope.services] == [[8080]]


def test_listeners_merge_their_ports_of_one_service() -> None:
    docs = [
        svc("multi", "shop", "10.0.0.9", 80, 8080, 9090),
        istio(
            "Sidecar",
            "default",
            "shop",
            {
                "egress": [
                    {"port": {"number": 8080, "protocol": "HTTP", "name": "a"}, "hosts": ["./*"]},
                    {"port": {"number": 9090, "protocol": "HTTP", "name": "b"}, "hosts": ["./*"]},
                ]
            },
        ),
        pod("frontend-1", "shop", "10.1.0.1", {"app": "frontend"}),
    ]
    scope = scope_of(docs)
    [multi] = scope.services
    assert [p.port for p in multi.ports] == [8080, 9090]
    assert scope.egress_listener_for_port(9090) is scope.egress[1]
    assert scope.egress_listener_for_port(80) is None, "no catch-all listener"


def test_same_hostname_in_two_namespaces_prefers_the_proxy_namespace() -> None:
    docs = [
        *base(),
        service_entry("shared-a", "pay", ["shared.example.com"]),
        service_entry("shared-b", "shop", ["shared.example.com"]),
    ]
    scope = scope_of(docs)
    assert scope.service("shared.example.com").namespace == "shop"  # type: ignore[union-attr]
    scope = scope_of(docs, "billing-1", "pay")
    assert scope.service("shared.example.com").namespace == "pay"  # type: ignore[union-attr]


def test_outbound_policy_comes_from_the_sidecar_over_the_mesh() -> None:
    mesh = "outboundTrafficPolicy: {mode: REGISTRY_ONLY}"
    assert scope_of(base(), mesh=mesh).outbound_traffic_policy == REGISTRY_ONLY
    docs = [*base(), sidecar("default", "shop", ["*/*"], outboundTrafficPolicy={"mode": "ALLOW_ANY"})]
    assert scope_of(docs, mesh=mesh).outbound_traffic_policy == ALLOW_ANY
    docs = [*base(), sidecar("default", "shop", ["*/*"], outboundTrafficPolicy={"mode": "REGISTRY_ONLY"})]
    assert scope_of(docs).outbound_traffic_policy == REGISTRY_ONLY
    docs = [
        *base(),
        sidecar(
            "default",
            "shop",
            ["*/*"],
            outboundTrafficPolicy={
                "mode": "ALLOW_ANY",
                "egressProxy": {"host": "egress.example.com", "port": {"number": 80}},
            },
        ),
    ]
    assert scope_of(docs).egress_proxy.host == "egress.example.com"  # type: ignore[union-attr]


# -- which Sidecar applies ----------------------------------------------------------------


def test_sidecar_selection_order() -> None:
    selected = istio(
        "Sidecar",
        "for-frontend",
        "shop",
        {"workloadSelector": {"labels": {"app": "frontend"}}, "egress": [{"hosts": ["tools/*"]}]},
    )
    namespace_wide = sidecar("default", "shop", ["./*"])
    root = sidecar("mesh-default", "istio-system", ["pay/*"])
    docs = [*base(), selected, namespace_wide, root]
    assert scope_of(docs).name == "for-frontend"
    assert scope_of(docs, "cart-1").name == "default"
    billing = scope_of(docs, "billing-1", "pay")
    assert billing.name == "mesh-default", "the root namespace's Sidecar is the fallback"
    assert billing.namespace == "pay"
    assert hosts(billing) == {fqdn("billing", "pay"), fqdn("ledger", "pay")}
    # "." in the root Sidecar means the proxy's namespace, not the root's.
    docs = [*base(), sidecar("mesh-default", "istio-system", ["./*"])]
    assert hosts(scope_of(docs, "billing-1", "pay")) == {fqdn("billing", "pay"), fqdn("ledger", "pay")}


def test_an_empty_selector_selects_every_workload_before_the_namespace_default() -> None:
    docs = [
        *base(),
        sidecar("a-default", "shop", ["./*"]),
        istio("Sidecar", "z-empty", "shop", {"workloadSelector": {}, "egress": [{"hosts": ["tools/*"]}]}),
    ]
    assert scope_of(docs).name == "z-empty"


def test_gateways_never_take_a_sidecar() -> None:
    docs = [*base(), pod("gw-1", "shop", "10.1.0.9", {"app": "gw"}), sidecar("default", "shop", ["./*"])]
    model = build(docs)
    gateway = model.proxy(f"router~10.1.0.9~gw-1.shop~shop.{SUFFIX}").sidecar_scope
    assert gateway is not None
    assert gateway.name == DEFAULT_SCOPE_NAME
    assert hosts(gateway) == ALL


def test_a_root_sidecar_with_a_selector_is_not_the_mesh_default() -> None:
    root = istio(
        "Sidecar",
        "root",
        "istio-system",
        {"workloadSelector": {"labels": {"app": "billing"}}, "egress": [{"hosts": ["./*"]}]},
    )
    assert scope_of([*base(), root], "billing-1", "pay").name == DEFAULT_SCOPE_NAME


# -- exportTo -------------------------------------------------------------------------------


def test_service_export_annotation() -> None:
    docs = [
        svc("private", "pay", "10.0.1.5", annotations={"networking.istio.io/exportTo": "."}),
        svc("to-shop", "pay", "10.0.1.6", annotations={"networking.istio.io/exportTo": "shop"}),
        svc("hidden", "pay", "10.0.1.7", annotations={"networking.istio.io/exportTo": "~"}),
        svc("hidden-too", "pay", "10.0.1.8", annotations={"networking.istio.io/exportTo": "~,shop"}),
        *base(),
    ]
    shop = hosts(scope_of(docs))
    pay = hosts(scope_of(docs, "billing-1", "pay"))
    assert fqdn("to-shop", "pay") in shop and fqdn("private", "pay") not in shop
    assert fqdn("private", "pay") in pay and fqdn("to-shop", "pay") not in pay
    assert fqdn("hidden", "pay") not in shop | pay
    assert fqdn("hidden-too", "pay") not in shop | pay, "~ hides from everyone"


def test_service_entry_export_to() -> None:
    docs = [*base(), service_entry("ext", "pay", ["ext.example.com"], exportTo=["."])]
    assert "ext.example.com" not in hosts(scope_of(docs))
    assert "ext.example.com" in hosts(scope_of(docs, "billing-1", "pay"))


def test_default_service_export_to() -> None:
    mesh = 'defaultServiceExportTo: ["."]'
    assert hosts(scope_of(base(), mesh=mesh)) == {fqdn("frontend", "shop"), fqdn("cart", "shop")}
    docs = [*base()]
    docs[2] = svc("billing", "pay", "10.0.1.1", annotations={"networking.istio.io/exportTo": "*"})
    assert fqdn("billing", "pay") in hosts(scope_of(docs, mesh=mesh)), "explicit exportTo beats the default"


def vs(name: str, namespace: str, host: str, dest: str, **extra: Any) -> Any:
    return istio(
        "VirtualService",
        name,
        namespace,
        {"hosts": [host], "http": [{"route": [{"destination": {"host": dest}}]}], **extra},
    )


def vs_names(scope: SidecarScope) -> list[str]:
    return [v.config.name for listener in scope.egress for v in listener.virtual_services]


def test_virtual_service_export_to() -> None:
    docs = [*base(), vs("local", "pay", "billing", "billing", exportTo=["."])]
    assert vs_names(scope_of(docs)) == []
    assert vs_names(scope_of(docs, "billing-1", "pay")) == ["local"]
    docs = [*base(), vs("to-shop", "pay", "billing", "billing", exportTo=["shop"])]
    assert vs_names(scope_of(docs)) == ["to-shop"]
    assert vs_names(scope_of(docs, "billing-1", "pay")) == []
    mesh = 'defaultVirtualServiceExportTo: ["."]'
    docs = [*base(), vs("default-export", "pay", "billing", "billing")]
    assert vs_names(scope_of(docs, mesh=mesh)) == []
    assert vs_names(scope_of(docs, "billing-1", "pay", mesh=mesh)) == ["default-export"]


def test_virtual_services_are_selected_by_the_egress_hosts() -> None:
    docs = [
        *base(),
        vs("billing", "pay", "billing", "billing"),
        vs("search", "tools", "search", "search"),
        vs("ext", "tools", "*.example.com", "search"),
    ]
    scope = scope_of([*docs, sidecar("default", "shop", ["pay/*"])])
    assert vs_names(scope) == ["billing"]
    # A VirtualService host overlapping an imported host either way is selected.
    scope = scope_of([*docs, sidecar("default", "shop", ["*/api.example.com"])])
    assert vs_names(scope) == ["ext"]
    # A VirtualService in another namespace is not imported by a host from this one.
    scope = scope_of([*docs, sidecar("default", "shop", [f"pay/{fqdn('search', 'tools')}"])])
    assert vs_names(scope) == []


def test_own_namespace_virtual_services_come_before_public_ones() -> None:
    older_public = vs("a-public", "pay", fqdn("billing", "pay"), "billing")
    private = vs("z-private", "shop", fqdn("billing", "pay"), fqdn("ledger", "pay"), exportTo=["."])
    assert vs_names(scope_of([*base(), older_public, private])) == ["z-private", "a-public"]


def test_virtual_service_destinations_join_the_scope() -> None:
    route = vs("cart", "shop", "cart", fqdn("billing", "pay"))
    scope = scope_of([*base(), route, sidecar("default", "shop", ["./*"])])
    assert fqdn("billing", "pay") in hosts(scope), "clusters exist for where the route sends traffic"
    assert fqdn("billing", "pay") not in {s.hostname for s in scope.egress[0].services}
    assert ConfigKey(Kind.SERVICE_ENTRY, fqdn("billing", "pay"), "pay") in scope.dependencies


def test_destinations_of_routes_for_other_source_namespaces_do_not_join() -> None:
    route = istio(
        "VirtualService",
        "cart",
        "shop",
        {
            "hosts": ["cart"],
            "http": [
                {
                    "match": [{"sourceNamespace": "tools"}],
                    "route": [{"destination": {"host": fqdn("billing", "pay")}}],
                },
                {"route": [{"destination": {"host": fqdn("ledger", "pay"), "port": {"number": 80}}}]},
            ],
        },
    )
    scope = scope_of([*base(), route, sidecar("default", "shop", ["./*"])])
    assert hosts(scope) == {fqdn("frontend", "shop"), fqdn("cart", "shop"), fqdn("ledger", "pay")}


# -- DestinationRules -------------------------------------------------------------------------


def dr(name: str, namespace: str, host: str, *subsets: str, **extra: Any) -> Any:
    spec = {"host": host, "subsets": [{"name": s, "labels": {"v": s}} for s in subsets], **extra}
    return istio("DestinationRule", name, namespace, spec)


def rule_names(scope: SidecarScope, host: str) -> list[str]:
    rule = scope.destination_rule(host)
    return [] if rule is None else [f"{c.namespace}/{c.name}" for c in rule.configs]


def test_destination_rule_lookup_order() -> None:
    billing = fqdn("billing", "pay")
    in_root = dr("root", "istio-system", billing, "r")
    in_service_ns = dr("svc", "pay", billing, "s")
    in_proxy_ns = dr("mine", "shop", billing, "m")
    assert rule_names(scope_of([*base(), in_root]), billing) == ["istio-system/root"]
    assert rule_names(scope_of([*base(), in_root, in_service_ns]), billing) == ["pay/svc"]
    assert rule_names(scope_of([*base(), in_root, in_service_ns, in_proxy_ns]), billing) == ["shop/mine"]


def test_destination_rule_export_to() -> None:
    billing = fqdn("billing", "pay")
    private = dr("svc", "pay", billing, "s", exportTo=["."])
    assert rule_names(scope_of([*base(), private]), billing) == []
    assert rule_names(scope_of([*base(), private], "billing-1", "pay"), billing) == ["pay/svc"]
    to_tools = dr("svc", "pay", billing, "s", exportTo=["tools"])
    assert rule_names(scope_of([*base(), to_tools]), billing) == []
    to_shop = dr("svc", "pay", billing, "s", exportTo=["shop"])
    assert rule_names(scope_of([*base(), to_shop]), billing) == ["pay/svc"]
    mesh = 'defaultDestinationRuleExportTo: ["."]'
    assert rule_names(scope_of([*base(), dr("svc", "pay", billing, "s")], mesh=mesh), billing) == []


def test_rules_for_one_host_merge_subsets_in_age_order() -> None:
    billing = fqdn("billing", "pay")
    first = dr("a", "pay", billing, "v1", trafficPolicy={"loadBalancer": {"simple": "RANDOM"}})
    second = dr("b", "pay", billing, "v1", "v2", trafficPolicy={"loadBalancer": {"simple": "LEAST_REQUEST"}})
    rule = scope_of([*base(), first, second]).destination_rule(billing)
    assert rule is not None
    assert [c.name for c in rule.configs] == ["a", "b"]
    assert [s.name for s in rule.subsets] == ["v1", "v2"]
    random = destination_rule_pb2.LoadBalancerSettings.RANDOM
    assert rule.traffic_policy.load_balancer.simple == random, "the first rule's policy"


def test_workload_selector_rules_apply_only_to_selected_workloads() -> None:
    cart = fqdn("cart", "shop")
    general = dr("general", "shop", cart, "all")
    selector = {"matchLabels": {"app": "frontend"}}
    frontend_only = dr("frontend-only", "shop", cart, "f", workloadSelector=selector)
    docs = [*base(), general, frontend_only]
    frontend = scope_of(docs)
    other = scope_of(docs, "cart-1")
    assert rule_names(frontend, cart) == ["shop/frontend-only"]
    assert rule_names(other, cart) == ["shop/general"]
    assert frontend is not other
    # A selector rule never leaves its namespace.
    assert rule_names(scope_of(docs, "billing-1", "pay"), cart) == ["shop/general"]
    both = ConfigKey(Kind.DESTINATION_RULE, "frontend-only", "shop")
    assert both in frontend.dependencies and both in other.dependencies


def test_root_namespace_proxies_prefer_the_service_namespace_over_root_exports() -> None:
    billing = fqdn("billing", "pay")
    docs = [
        *base(),
        pod("gw-1", "istio-system", "10.1.9.1", {"app": "gw"}),
        dr("catch-all", "istio-system", "*.local", "r"),
        dr("svc", "pay", billing, "s"),
    ]
    model = build(docs)
    scope = proxy_in(model, "gw-1", "istio-system", "10.1.9.1").sidecar_scope
    assert scope is not None
    assert rule_names(scope, billing) == ["pay/svc"]
    assert rule_names(scope, fqdn("cart", "shop")) == ["istio-system/catch-all"]


def test_scope_dependencies_decide_pushes() -> None:
    scope = scope_of([*base(), sidecar("default", "shop", ["./*"])])
    assert scope.depends_on(ConfigKey(Kind.SERVICE_ENTRY, fqdn("cart", "shop"), "shop"), "istio-system")
    assert not scope.depends_on(ConfigKey(Kind.SERVICE_ENTRY, fqdn("billing", "pay"), "pay"), "istio-system")
    assert scope.depends_on(ConfigKey(Kind.SIDECAR, "default", "shop"), "istio-system")
    assert not scope.depends_on(ConfigKey(Kind.VIRTUAL_SERVICE, "x", "pay"), "istio-system")
    assert scope.depends_on(ConfigKey(Kind.AUTHORIZATION_POLICY, "x", "istio-system"), "istio-system")
    assert not scope.depends_on(ConfigKey(Kind.AUTHORIZATION_POLICY, "x", "pay"), "istio-system")


# -- default scopes shared across namespaces ----------------------------------------------

NAMESPACES = ("shop", "pay", "tools", "lab", "empty", "spare", "istio-system")


def rule(name: str, namespace: str, host: str, **extra: Any) -> Any:
    return istio("DestinationRule", name, namespace, {"host": host, **extra})


def view(scope: SidecarScope) -> dict[str, Any]:
    """Everything of a scope the generators read: services by identity (both scopes come from one
    registry), rules and VirtualServices (made per snapshot) by what they hold."""

    def rule_of(found: Any) -> Any:
        return None if found is None else (found.host, [c.key for c in found.configs], found.export_to)

    return {
        "services": [id(s) for s in scope.services],
        "by_host": {h: id(s) for h, s in scope._by_host.items()},
        "rules": {h: rule_of(r) for h, r in scope.destination_rules.items()},
        "dependencies": scope.dependencies,
        "egress": [
            ([id(s) for s in e.services], [v.config.key for v in e.virtual_services], e.imports)
            for e in scope.egress
        ],
        "namespace": scope.namespace,
        "signature": scope.import_signature(),
    }


def scopes(docs: list[Any], *, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every namespace's default scope, (shared, each built alone), from one registry."""
    env = build(docs).env
    shared = env.build_push_context("v1")
    together = {"push": shared, **{ns: build_scope(shared, ns, None) for ns in NAMESPACES}}
    with monkeypatch.context() as patch:
        patch.setattr(sidecar_scope, "_default_imports", lambda *args: None)
        push = env.build_push_context("v2")
        alone = {ns: build_scope(push, ns, None) for ns in NAMESPACES}
    return together, alone


MIXED: list[Any] = [
    *base(),
    svc("lab-only", "lab", "10.0.3.1", annotations={"networking.istio.io/exportTo": "lab"}),
    # One hostname in two namespaces: each of them prefers its own copy.
    service_entry("api", "shop", ["api.example.com"]),
    service_entry("api", "tools", ["api.example.com"]),
    rule("cart", "pay", "cart.shop.svc.cluster.local"),
    rule("all", "istio-system", "*.svc.cluster.local"),
    vs("to-billing", "shop", "billing.pay.svc.cluster.local", "billing.pay.svc.cluster.local"),
]


HIDDEN_HOST = "hidden.spare.svc.cluster.local"
#: A service of "spare" that only "shop" sees, and a public VirtualService routing to it: "spare" still
#: shares the public services, and its scope takes the service as a VirtualService destination.
HIDDEN: list[Any] = [
    *MIXED,
    svc("hidden", "spare", "10.0.4.1", annotations={"networking.istio.io/exportTo": "shop"}),
    vs("to-hidden", "tools", HIDDEN_HOST, HIDDEN_HOST),
]


@pytest.mark.parametrize(
    "docs",
    [
        pytest.param(base(), id="plain"),
        pytest.param(MIXED, id="mixed"),
        pytest.param(
            # The service's own namespace exports a rule for it to one namespace only.
            [*MIXED, rule("billing", "pay", "billing.pay.svc.cluster.local", exportTo=["spare"])],
            id="a rule exported to some namespaces",
        ),
        pytest.param(HIDDEN, id="a VirtualService adds a service its namespace does not see"),
        pytest.param(
            [*HIDDEN, service_entry("hidden-copy", "tools", [HIDDEN_HOST])],
            id="... in place of a shared copy",
        ),
    ],
)
def test_each_namespace_gets_the_scope_it_would_build_alone(
    docs: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    together, alone = scopes(docs, monkeypatch=monkeypatch)
    for ns in NAMESPACES:
        assert view(together[ns]) == view(alone[ns]), ns


def test_namespaces_that_decide_nothing_share_one_import_list(monkeypatch: pytest.MonkeyPatch) -> None:
    built, _ = scopes(MIXED, monkeypatch=monkeypatch)
    push: PushContext = built["push"]

    def listener_services(ns: str) -> tuple[Any, ...]:
        return built[ns].egress[0].services  # type: ignore[no-any-return]

    # "empty" and "spare" see only public services, own no shared hostname, read rules as others do.
    assert listener_services("empty") is listener_services("spare")
    # With it, the signature the outputs built from a scope are shared by: worked out once.
    assert built["empty"].import_signature() is built["spare"].import_signature()
    # Not shared: namespaces with their own copy of a hostname, one with a rule of its own, one that
    # sees a service others do not, and the root namespace (its own private rules come first).
    for own in ("shop", "tools", "pay", "lab", "istio-system"):
        assert listener_services(own) is not listener_services("empty"), own
    assert not push.destination_rules.same_for("pay")  # its DestinationRule for cart
    assert push.destination_rules.same_for("empty")


def test_a_rule_exported_to_named_namespaces_stops_the_sharing(monkeypatch: pytest.MonkeyPatch) -> None:
    docs = [*base(), rule("billing", "tools", "billing.pay.svc.cluster.local", exportTo=["shop"])]
    push = build(docs).env.build_push_context("v1")
    assert not push.destination_rules.same_for("lab")
    scopes_ = [build_scope(push, ns, None) for ns in ("lab", "empty")]
    assert scopes_[0].egress[0].services is not scopes_[1].egress[0].services


def test_a_displaced_shared_service_gives_the_namespace_its_own_union() -> None:
    union = sidecar_scope._ServiceUnion()
    kube = build(base()).push.services[0]
    union.add(kube)
    shared = sidecar_scope._Imported(list(union.services), dict(union.index))
    entry = replace(kube, registry=Registry.EXTERNAL)
    union = sidecar_scope._ServiceUnion(shared)
    union.add(entry)
    assert not union.displaced, "a ServiceEntry never displaces a Kubernetes service"
    shared = sidecar_scope._Imported([entry], {entry.hostname: 0})
    union = sidecar_scope._ServiceUnion(shared)
    union.add(kube)
    assert union.displaced and union.services == [kube]


def test_a_virtual_service_destination_that_displaces_a_shared_service_gets_its_own_scope(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    docs = [*HIDDEN, service_entry("hidden-copy", "tools", [HIDDEN_HOST])]
    built, _ = scopes(docs, monkeypatch=monkeypatch)
    spare, empty = built["spare"], built["empty"]
    # "empty" keeps the public ServiceEntry; "spare" routes to its own Kubernetes service instead.
    assert empty.service(HIDDEN_HOST).registry is Registry.EXTERNAL
    assert spare.service(HIDDEN_HOST).registry is Registry.KUBERNETES
    assert spare.egress[0].services is not empty.egress[0].services


def test_visible_services_come_private_then_exported_then_public_each_oldest_first() -> None:
    docs = [
        svc("a-public", "pay", "10.0.5.1"),
        svc("b-to-shop", "pay", "10.0.5.2", annotations={"networking.istio.io/exportTo": "shop"}),
        svc("c-private", "shop", "10.0.5.3", annotations={"networking.istio.io/exportTo": "."}),
        svc("d-public", "tools", "10.0.5.4"),
    ]
    push = build(docs).push
    names = [s.name for s in push.services_visible_to("shop")]
    assert names == ["c-private", "b-to-shop", "a-public", "d-public"]
    # Namespaces that see only public services share one list.
    assert push.services_visible_to("tools") is push.services_visible_to("lab")
    assert [s.name for s in push.services_visible_to("lab")] == ["a-public", "d-public"]
