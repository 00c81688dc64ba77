"""AuthorizationPolicy on proxyless gRPC servers: istiod's grpcgen RBAC filters, closed where it is open."""

from __future__ import annotations

from typing import Any

import pytest
from envoy.config.listener.v3 import listener_pb2
from envoy.config.rbac.v3 import rbac_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2 as http_rbac_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from google.protobuf import json_format
from support.kube import istio, workload
from support.mesh_objects import mesh_objects
from support.model import Model, build

from meshpilot.config import decode
from meshpilot.model.config import ConfigKey
from meshpilot.model.kind import Kind
from meshpilot.model.push_request import PushRequest
from meshpilot.networking.authz_rule import TrustDomains, rule_policy
from meshpilot.networking.policy_problems import PROBLEMS
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.generators.base import GenerationContext
from meshpilot.xds.generators.grpc import GrpcListenerGenerator
from meshpilot.xds.types import TypeUrl

SERVER = "sidecar~10.1.0.21~reviews-v1.default~default.svc.cluster.local"
INBOUND = "xds.istio.io/grpc/lds/inbound/0.0.0.0:9080"
DENY_FILTER = "envoy.filters.http.rbac.DENY"
ALLOW_FILTER = "envoy.filters.http.rbac"
ROUTER = "envoy.filters.http.router"
NEVER = rbac_pb2.Policy(
    permissions=[rbac_pb2.Permission(not_rule=rbac_pb2.Permission(any=True))],
    principals=[rbac_pb2.Principal(not_id=rbac_pb2.Principal(any=True))],
)


def policy(name: str, spec: dict[str, Any], namespace: str = "default", **meta: Any) -> dict[str, Any]:
    doc = istio("AuthorizationPolicy", name, namespace, spec, group="security")
    doc["metadata"].update(meta)
    return doc


def model_with(*docs: dict[str, Any], mesh_yaml: str | None = None) -> Model:
    return build([*mesh_objects(), *docs], mesh_yaml)


def server_filters(model: Model, node: str = SERVER, name: str = INBOUND) -> list[Any]:
    proxy = model.proxy(node, {"GENERATOR": "grpc"})
    ctx = GenerationContext(proxy, model.push, model.index, PushRequest(push=model.push))
    watch = WatchedResource(TypeUrl.LISTENER, names=frozenset({name}))
    [resource] = GrpcListenerGenerator().generate(ctx, watch, None) or []
    listener = listener_pb2.Listener()
    assert resource.message().Unpack(listener)
    [chain] = listener.filter_chains
    hcm = hcm_pb2.HttpConnectionManager()
    assert chain.filters[0].typed_config.Unpack(hcm)
    return list(hcm.http_filters)


def rules_of(f: Any) -> Any:
    config = http_rbac_pb2.RBAC()
    assert f.typed_config.Unpack(config)
    assert not config.HasField("shadow_rules") and not config.shadow_rules_stat_prefix
    return config.rules


def names(filters: list[Any]) -> list[str]:
    return [f.name for f in filters]


REVIEWS = {"matchLabels": {"app": "reviews"}}


def test_no_policy_leaves_only_the_router() -> None:
    assert names(server_filters(model_with())) == [ROUTER]


def test_deny_and_allow_filters_precede_the_router_with_grpcgen_names() -> None:
    deny_rule = {"to": [{"operation": {"paths": ["/admin.*"], "methods": ["POST"]}}]}
    allow_rule = {
        "from": [{"source": {"principals": ["cluster.local/ns/default/sa/productpage"]}}],
        "to": [{"operation": {"paths": ["/reviews.Reviews/*"]}}],
        "when": [{"key": "request.headers[x-user]", "values": ["alice"]}],
    }
    model = model_with(
        policy("block", {"selector": REVIEWS, "action": "DENY", "rules": [deny_rule]}),
        policy(
            "pages",
            {"selector": REVIEWS, "rules": [allow_rule, {"from": [{"source": {"namespaces": ["x"]}}]}]},
        ),
        # Selects other workloads: not on this server.
        policy(
            "elsewhere", {"selector": {"matchLabels": {"app": "ratings"}}, "action": "DENY", "rules": [{}]}
        ),
    )
    filters = server_filters(model)
    assert names(filters) == [DENY_FILTER, ALLOW_FILTER, ROUTER]
    deny, allow = rules_of(filters[0]), rules_of(filters[1])
    assert deny.action == rbac_pb2.RBAC.DENY and allow.action == rbac_pb2.RBAC.ALLOW
    assert list(deny.policies) == ["default-block-0"]
    assert sorted(allow.policies) == ["default-pages-0", "default-pages-1"]
    # The sidecar's rule builder: the same policy as a sidecar's HTTP chain gets (one trust domain).
    for got, action in (
        (deny.policies["default-block-0"], rbac_pb2.RBAC.DENY),
        (allow.policies["default-pages-0"], rbac_pb2.RBAC.ALLOW),
    ):
        spec = model.push.configs(Kind.AUTHORIZATION_POLICY, "default")
        parsed = next(c for c in spec if c.spec.action == (1 if action == rbac_pb2.RBAC.DENY else 0))
        expected = rule_policy(
            parsed.spec.rules[0],
            "default",
            TrustDomains(("cluster.local",)),
            for_tcp=False,
            action=action,
        )
        assert got == expected
    principal = json_format.MessageToDict(allow.policies["default-pages-0"].principals[0])
    assert principal["andIds"]["ids"][0]["orIds"]["ids"][0]["authenticated"]["principalName"] == {
        "exact": "spiffe://cluster.local/ns/default/sa/productpage"
    }


def test_root_namespace_policies_apply_and_trust_domain_aliases_are_not_migrated() -> None:
    rule = {"from": [{"source": {"principals": ["cluster.local/ns/default/sa/productpage"]}}]}
    mesh = "trustDomain: example.org\ntrustDomainAliases: [old.org]\n"
    model = model_with(policy("mesh-wide", {"rules": [rule]}, namespace="istio-system"), mesh_yaml=mesh)
    filters = server_filters(model)
    assert names(filters) == [ALLOW_FILTER, ROUTER]
    allow = rules_of(filters[0])
    [name] = allow.policies
    assert name == "istio-system-mesh-wide-0"
    text = json_format.MessageToJson(allow.policies[name])
    # istiod's grpcgen skips MigrateTrustDomain: the principal stays as written.
    assert "spiffe://cluster.local/ns/default/sa/productpage" in text
    assert "example.org" not in text and "old.org" not in text


def test_custom_is_denied_not_ignored_and_counted() -> None:
    doc = policy(
        "ext",
        {
            "selector": REVIEWS,
            "action": "CUSTOM",
            "provider": {"name": "my-authz"},
            "rules": [{"to": [{"operation": {"paths": ["/x"]}}]}],
        },
    )
    before = PROBLEMS.count("AuthorizationPolicy", "default/ext")
    filters = server_filters(model_with(doc))
    assert names(filters) == [DENY_FILTER, ROUTER]
    deny = rules_of(filters[0])
    assert deny.action == rbac_pb2.RBAC.DENY
    assert list(deny.policies) == ["default-ext-0-deny-due-to-bad-CUSTOM-action"]
    assert "/x" in json_format.MessageToJson(deny.policies["default-ext-0-deny-due-to-bad-CUSTOM-action"])
    assert PROBLEMS.count("AuthorizationPolicy", "default/ext") > before


def test_an_allow_nothing_policy_allows_nothing() -> None:
    # istiod's grpcgen adds no policy for it, so alone it would allow everything.
    filters = server_filters(model_with(policy("nothing", {"selector": REVIEWS})))
    assert names(filters) == [ALLOW_FILTER, ROUTER]
    assert dict(rules_of(filters[0]).policies) == {"default-nothing-0": NEVER}


def test_rules_that_cannot_be_generated(monkeypatch: pytest.MonkeyPatch) -> None:
    # Validation rejects these; the generator still guards against them, as istiod's does.
    monkeypatch.setattr(decode, "validate_config", lambda config: [])
    bad_value = {
        "to": [{"operation": {"paths": ["/a"]}}],
        "when": [{"key": "destination.port", "values": ["x"]}],
    }
    unknown_key = {"when": [{"key": "request.nonsense", "values": ["1"]}]}
    model = model_with(
        policy("strict", {"selector": REVIEWS, "rules": [bad_value, unknown_key, {}]}),
        policy("loose", {"selector": REVIEWS, "action": "DENY", "rules": [bad_value, unknown_key]}),
    )
    before = PROBLEMS.count("AuthorizationPolicy", "default/strict")
    deny, allow = (rules_of(f) for f in server_filters(model)[:2])
    # ALLOW: the bad value makes the rule allow nothing; the unknown key skips the rule (istiod's New).
    assert sorted(allow.policies) == ["default-strict-0", "default-strict-2"]
    assert allow.policies["default-strict-0"] == NEVER
    # DENY: the bad value is left out (it denies more); the unknown key skips the rule.
    assert list(deny.policies) == ["default-loose-0"]
    assert "/a" in json_format.MessageToJson(deny.policies["default-loose-0"])
    assert PROBLEMS.count("AuthorizationPolicy", "default/strict") > before


def test_audit_dry_run_and_request_authentication_are_reported() -> None:
    audit = policy("watch", {"selector": REVIEWS, "action": "AUDIT", "rules": [{}]})
    dry = policy(
        "trial",
        {"selector": REVIEWS, "action": "DENY", "rules": [{"to": [{"operation": {"paths": ["/x"]}}]}]},
        annotations={"istio.io/dry-run": "true"},
    )
    jwt = istio(
        "RequestAuthentication",
        "tokens",
        "default",
        {"selector": REVIEWS, "jwtRules": [{"issuer": "https://issuer.example", "jwks": '{"keys": []}'}]},
        group="security",
    )
    counts = {
        key: PROBLEMS.count(*key)
        for key in (
            ("AuthorizationPolicy", "default/watch"),
            ("AuthorizationPolicy", "default/trial"),
            ("RequestAuthentication", "default/tokens"),
        )
    }
    filters = server_filters(model_with(audit, dry, jwt))
    # AUDIT is ignored (no LOG action in gRPC); dry-run is enforced, as istiod's grpcgen does.
    assert names(filters) == [DENY_FILTER, ROUTER]
    assert list(rules_of(filters[0]).policies) == ["default-trial-0"]
    for key, before in counts.items():
        assert PROBLEMS.count(*key) > before, key


def test_an_mtls_chain_gets_the_filters_too() -> None:
    docs = [
        *workload(
            "secure",
            "default",
            "10.96.0.70",
            9090,
            {"secure-0": "10.1.0.71"},
            labels={"security.istio.io/tlsMode": "istio"},
            port_name="grpc",
        ),
        policy("only-ns", {"rules": [{"from": [{"source": {"namespaces": ["default"]}}]}]}),
    ]
    node = "sidecar~10.1.0.71~secure-0.default~default.svc.cluster.local"
    filters = server_filters(build(docs), node, "xds.istio.io/grpc/lds/inbound/[::]:9090")
    assert names(filters) == [ALLOW_FILTER, ROUTER]
    assert list(rules_of(filters[0]).policies) == ["default-only-ns-0"]


def test_policy_changes_push_grpc_listeners() -> None:
    lds = GrpcListenerGenerator()
    for kind in (Kind.AUTHORIZATION_POLICY, Kind.REQUEST_AUTHENTICATION):
        request = PushRequest(full=True, configs_updated=frozenset({ConfigKey(kind, "x", "default")}))
        assert lds.needs_push(request), kind
