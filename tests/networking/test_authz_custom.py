"""CUSTOM AuthorizationPolicies on a sidecar's inbound chains: istiod's marking RBAC filter and the
provider's ext_authz filter, or its deny filter when the provider cannot be used."""

from __future__ import annotations

import dataclasses
from typing import Any

from envoy.config.rbac.v3 import rbac_pb2
from envoy.extensions.filters.http.ext_authz.v3 import ext_authz_pb2 as http_ext_authz_pb2
from envoy.extensions.filters.network.ext_authz.v3 import ext_authz_pb2 as tcp_ext_authz_pb2
from envoy.extensions.filters.network.rbac.v3 import rbac_pb2 as tcp_rbac_pb2
from support.kube import istio, workload
from support.mesh_objects import CLIENT

from meshpilot.config.decode import decode_object
from meshpilot.model.authorization import authorization_policies
from meshpilot.networking import authz_custom, ext_authz, rbac
from meshpilot.networking.policy_problems import PROBLEMS

from .test_rbac import DB, as_dict, chain, http_filters, http_rbac, model_with, policy, virtual_inbound

AUTHZ = workload("ext-authz", "default", "10.96.0.90", 8000, {"ext-authz-0": "10.1.0.90"}, port_name="http")
GRPC_AUTHZ = workload("authz", "auth", "10.96.0.91", 9000, {"authz-0": "10.1.0.91"}, port_name="grpc")
MESH = """
extensionProviders:
- name: http-authz
  envoyExtAuthzHttp: {service: ext-authz.default.svc.cluster.local, port: 8000, failOpen: true}
- name: grpc-authz
  envoyExtAuthzGrpc: {service: auth/authz.auth.svc.cluster.local, port: 9000}
- name: late-authz
  envoyExtAuthzHttp: {service: late.default.svc.cluster.local, port: 8000}
"""


def custom(name: str, provider: str, rules: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return policy(name, {"action": "CUSTOM", "provider": {"name": provider}, "rules": rules, **spec})


ADMIN = [{"to": [{"operation": {"paths": ["/admin*"]}}]}]
DENY_ALL_FROM_BAD = policy(
    "deny-bad", {"action": "DENY", "rules": [{"from": [{"source": {"namespaces": ["bad"]}}]}]}
)


def ext_authz_http(f: Any) -> Any:
    assert f.name == "envoy.filters.http.ext_authz"
    out = http_ext_authz_pb2.ExtAuthz()
    f.typed_config.Unpack(out)
    return out


def enabled_by(rbac_filter: str, provider: str) -> dict[str, Any]:
    return {
        "filter": rbac_filter,
        "path": [{"key": "istio_ext_authz_shadow_effective_policy_id"}],
        "value": {"stringMatch": {"prefix": f"istio-ext-authz-{provider}"}},
    }


def test_http_provider_marks_then_checks_before_jwt_and_rbac() -> None:
    request_authn = istio(
        "RequestAuthentication",
        "jwt",
        "default",
        {"jwtRules": [{"issuer": "https://issuer.test", "jwks": '{"keys": []}'}]},
        group="security",
    )
    model = model_with(
        *AUTHZ, custom("ext", "http-authz", ADMIN), DENY_ALL_FROM_BAD, request_authn, mesh_yaml=MESH
    )
    filters = http_filters(virtual_inbound(model), 9080)
    names = [f.name for f in filters]
    start = names.index("envoy.filters.http.rbac")
    assert names[start : start + 4] == [
        "envoy.filters.http.rbac",
        "envoy.filters.http.ext_authz",
        "envoy.filters.http.jwt_authn",
        "envoy.filters.http.rbac",
    ]
    marking = http_rbac(filters[start])
    assert not marking.HasField("rules"), "CUSTOM's RBAC filter enforces nothing"
    assert marking.shadow_rules_stat_prefix == "istio_ext_authz_"
    assert marking.shadow_rules.action == rbac_pb2.RBAC.DENY
    assert list(marking.shadow_rules.policies) == [
        "istio-ext-authz-http-authz-ns[default]-policy[ext]-rule[0]"
    ]
    check = ext_authz_http(filters[start + 1])
    assert as_dict(check.filter_enabled_metadata) == enabled_by("envoy.filters.http.rbac", "http-authz")
    assert check.failure_mode_allow
    assert check.http_service.server_uri.cluster == "outbound|8000||ext-authz.default.svc.cluster.local"
    # The DENY policy's own filter follows, unchanged.
    assert list(http_rbac(filters[start + 3]).rules.policies) == ["ns[default]-policy[deny-bad]-rule[0]"]


def test_http_provider_leaves_tcp_chains_alone() -> None:
    model = model_with(*AUTHZ, custom("ext", "http-authz", ADMIN), mesh_yaml=MESH)
    tcp = chain(virtual_inbound(model, DB), 3306)
    assert [f.name for f in tcp.filters] == ["istio.metadata_exchange", "envoy.filters.network.tcp_proxy"]


def test_grpc_provider_checks_tcp_connections() -> None:
    ports = [{"to": [{"operation": {"ports": ["3306"]}}]}]
    model = model_with(*GRPC_AUTHZ, custom("ext", "grpc-authz", ports), mesh_yaml=MESH)
    tcp = chain(virtual_inbound(model, DB), 3306)
    assert [f.name for f in tcp.filters] == [
        "istio.metadata_exchange",
        "envoy.filters.network.rbac",
        "envoy.filters.network.ext_authz",
        "envoy.filters.network.tcp_proxy",
    ]
    marking = tcp_rbac_pb2.RBAC()
    tcp.filters[1].typed_config.Unpack(marking)
    assert marking.stat_prefix == "tcp."
    assert marking.shadow_rules_stat_prefix == "istio_ext_authz_"
    assert list(marking.shadow_rules.policies) == [
        "istio-ext-authz-grpc-authz-ns[default]-policy[ext]-rule[0]"
    ]
    check = tcp_ext_authz_pb2.ExtAuthz()
    tcp.filters[2].typed_config.Unpack(check)
    assert as_dict(check.filter_enabled_metadata) == enabled_by("envoy.filters.network.rbac", "grpc-authz")
    assert check.grpc_service.envoy_grpc.cluster_name == "outbound|9000||authz.auth.svc.cluster.local"


def test_two_providers_on_one_workload_are_both_denied() -> None:
    docs = [custom("a", "http-authz", ADMIN), custom("b", "grpc-authz", ADMIN)]
    before = PROBLEMS.count("AuthorizationPolicy", "default/b")
    model = model_with(*AUTHZ, *GRPC_AUTHZ, *docs, mesh_yaml=MESH)
    filters = http_filters(virtual_inbound(model), 9080)
    assert "envoy.filters.http.ext_authz" not in [f.name for f in filters]
    denied = [list(http_rbac(f).rules.policies) for f in filters if f.name == "envoy.filters.http.rbac"]
    # One filter per provider, in provider name order.
    assert denied == [
        ["istio-ext-authz-grpc-authz-ns[default]-policy[b]-rule[0]-deny-due-to-bad-CUSTOM-action"],
        ["istio-ext-authz-http-authz-ns[default]-policy[a]-rule[0]-deny-due-to-bad-CUSTOM-action"],
    ]
    assert PROBLEMS.count("AuthorizationPolicy", "default/b") > before


def test_dry_run_custom_rules_are_the_filters_enforced_rules() -> None:
    """istiod's validation refuses dry-run on CUSTOM; given one anyway, its builder puts the dry-run
    policies in the marking filter's ``rules`` (which then deny what they match)."""
    model = model_with(*AUTHZ, custom("ext", "http-authz", ADMIN), mesh_yaml=MESH)
    proxy = model.proxy(CLIENT)
    (config,) = authorization_policies(model.push, proxy).custom
    dry = dataclasses.replace(
        config, meta=dataclasses.replace(config.meta, name="dry", annotations={"istio.io/dry-run": "true"})
    )
    providers = ext_authz.providers(model.push)
    marking, _ = authz_custom.http_filters([config, dry], providers, rbac.trust_domains(model.push.mesh))
    rules = http_rbac(marking)
    assert list(rules.shadow_rules.policies) == ["istio-ext-authz-http-authz-ns[default]-policy[ext]-rule[0]"]
    assert list(rules.rules.policies) == ["istio-ext-authz-http-authz-ns[default]-policy[dry]-rule[0]"]


def test_a_provider_service_arriving_later_reaches_the_cached_inbound_listener() -> None:
    model = model_with(custom("ext", "late-authz", ADMIN), mesh_yaml=MESH)
    names = [f.name for f in http_filters(virtual_inbound(model), 9080)]
    assert "envoy.filters.http.ext_authz" not in names, "the service is not known yet: denied"
    entry = {
        "hosts": ["late.default.svc.cluster.local"],
        "location": "MESH_INTERNAL",
        "resolution": "STATIC",
        "ports": [{"number": 8000, "name": "http", "protocol": "HTTP"}],
        "endpoints": [{"address": "10.1.0.95"}],
    }
    model.env.store.upsert(decode_object(istio("ServiceEntry", "late", "default", entry)).obj)
    model.push = model.env.build_push_context("test/2")
    names = [f.name for f in http_filters(virtual_inbound(model), 9080)]
    assert "envoy.filters.http.ext_authz" in names
