"""AuthorizationPolicy on a sidecar's inbound chains: istiod's RBAC filters, names and order."""

from __future__ import annotations

from typing import Any

from envoy.config.listener.v3 import listener_pb2
from envoy.config.rbac.v3 import rbac_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2 as http_rbac_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.filters.network.rbac.v3 import rbac_pb2 as tcp_rbac_pb2
from google.protobuf import json_format
from support.kube import istio
from support.mesh_objects import CLIENT, mesh_objects
from support.model import Model, build

from meshpilot.model.push_request import PushRequest
from meshpilot.networking.policy_problems import PROBLEMS
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.generators.base import GenerationContext
from meshpilot.xds.generators.lds import ListenerGenerator

LDS = "type.googleapis.com/envoy.config.listener.v3.Listener"
DB = "sidecar~10.1.0.41~db-0.default~default.svc.cluster.local"


def policy(name: str, spec: dict[str, Any], namespace: str = "default", **meta: Any) -> dict[str, Any]:
    doc = istio("AuthorizationPolicy", name, namespace, spec, group="security")
    doc["metadata"].update(meta)
    return doc


def virtual_inbound(model: Model, node: str = CLIENT) -> Any:
    proxy = model.proxy(node)
    ctx = GenerationContext(proxy, model.push, model.index, PushRequest(push=model.push))
    for resource in ListenerGenerator().generate(ctx, WatchedResource(LDS), None) or []:
        listener = listener_pb2.Listener()
        resource.message().Unpack(listener)
        if listener.name == "virtualInbound":
            return listener
    raise AssertionError("no virtualInbound")


def chain(listener: Any, port: int, transport: str = "raw_buffer") -> Any:
    for c in listener.filter_chains:
        match = c.filter_chain_match
        if match.destination_port.value == port and match.transport_protocol == transport:
            return c
    raise AssertionError(f"no {transport} chain for {port}")


def http_filters(listener: Any, port: int) -> list[Any]:
    hcm = hcm_pb2.HttpConnectionManager()
    # The HCM ends the chain (an inbound chain starts with metadata exchange).
    chain(listener, port).filters[-1].typed_config.Unpack(hcm)
    return list(hcm.http_filters)


def http_rbac(f: Any) -> Any:
    assert f.name == "envoy.filters.http.rbac"
    out = http_rbac_pb2.RBAC()
    f.typed_config.Unpack(out)
    return out


def as_dict(message: Any) -> Any:
    return json_format.MessageToDict(message)


def model_with(*docs: dict[str, Any], mesh_yaml: str | None = None) -> Model:
    return build([*mesh_objects(), *docs], mesh_yaml)


def test_no_policy_no_filter() -> None:
    names = [f.name for f in http_filters(virtual_inbound(model_with()), 9080)]
    assert "envoy.filters.http.rbac" not in names


def test_deny_then_allow_with_istiod_names_and_matchers() -> None:
    deny = policy(
        "deny-admin",
        {"action": "DENY", "rules": [{"to": [{"operation": {"paths": ["/admin*"], "methods": ["POST"]}}]}]},
    )
    allow = policy(
        "allow-reviews",
        {
            "selector": {"matchLabels": {"app": "productpage"}},
            "rules": [
                {
                    "from": [{"source": {"principals": ["cluster.local/ns/default/sa/reviews"]}}],
                    "to": [{"operation": {"paths": ["/api/{*}/items/{**}"]}}],
                    "when": [{"key": "request.headers[x-tenant]", "values": ["acme"]}],
                }
            ],
        },
    )
    filters = http_filters(virtual_inbound(model_with(deny, allow)), 9080)
    names = [f.name for f in filters]
    assert names.index("envoy.filters.http.rbac") < names.index("envoy.filters.http.grpc_stats")
    deny_filter, allow_filter = (http_rbac(f) for f in filters if f.name == "envoy.filters.http.rbac")
    assert deny_filter.rules.action == rbac_pb2.RBAC.DENY
    assert allow_filter.rules.action == rbac_pb2.RBAC.ALLOW
    denied = as_dict(deny_filter.rules.policies["ns[default]-policy[deny-admin]-rule[0]"])
    assert denied == {
        "permissions": [
            {
                "andRules": {
                    "rules": [
                        {
                            "orRules": {
                                "rules": [{"header": {"name": ":method", "stringMatch": {"exact": "POST"}}}]
                            }
                        },
                        {"orRules": {"rules": [{"urlPath": {"path": {"prefix": "/admin"}}}]}},
                    ]
                }
            }
        ],
        "principals": [{"andIds": {"ids": [{"any": True}]}}],
    }
    allowed = as_dict(allow_filter.rules.policies["ns[default]-policy[allow-reviews]-rule[0]"])
    template = allowed["permissions"][0]["andRules"]["rules"][0]["orRules"]["rules"][0]["uriTemplate"]
    assert template["name"] == "uri-template"
    assert template["typedConfig"]["pathTemplate"] == "/api/*/items/**"
    assert allowed["principals"][0]["andIds"]["ids"] == [
        {
            "orIds": {
                "ids": [
                    {
                        "authenticated": {
                            "principalName": {"exact": "spiffe://cluster.local/ns/default/sa/reviews"}
                        }
                    }
                ]
            }
        },
        {"orIds": {"ids": [{"header": {"name": "x-tenant", "stringMatch": {"exact": "acme"}}}]}},
    ]


def test_allow_without_rules_denies_everything_and_scoping() -> None:
    docs = [
        policy("deny-all", {}),
        # Another workload's selector, a targetRef (gateways only) and another namespace: not applied.
        policy(
            "reviews-only", {"selector": {"matchLabels": {"app": "reviews"}}, "action": "DENY", "rules": [{}]}
        ),
        policy(
            "gateway-only",
            {
                "targetRefs": [{"kind": "Gateway", "group": "gateway.networking.k8s.io", "name": "gw"}],
                "action": "DENY",
                "rules": [{}],
            },
        ),
        policy("elsewhere", {"action": "DENY", "rules": [{}]}, namespace="other"),
        # The root namespace's policies apply everywhere.
        policy("mesh-audit", {"action": "AUDIT", "rules": [{}]}, namespace="istio-system"),
    ]
    filters = [
        http_rbac(f) for f in http_filters(virtual_inbound(model_with(*docs)), 9080) if "rbac" in f.name
    ]
    assert [f.rules.action for f in filters] == [rbac_pb2.RBAC.LOG, rbac_pb2.RBAC.ALLOW]
    assert list(filters[0].rules.policies) == ["ns[istio-system]-policy[mesh-audit]-rule[0]"]
    never = as_dict(filters[1].rules.policies["ns[default]-policy[deny-all]-rule[0]"])
    assert never == {"permissions": [{"notRule": {"any": True}}], "principals": [{"notId": {"any": True}}]}


def test_http_only_fields_on_tcp_follow_istiod() -> None:
    docs = [
        # ALLOW: a rule with an HTTP-only field is dropped whole (allows less).
        policy("allow-get", {"rules": [{"to": [{"operation": {"methods": ["GET"]}}]}]}),
        # DENY: only the HTTP-only field is dropped (denies more).
        policy(
            "deny-path",
            {
                "action": "DENY",
                "rules": [
                    {"from": [{"source": {"namespaces": ["bad"]}}], "to": [{"operation": {"paths": ["/x"]}}]}
                ],
            },
        ),
    ]
    listener = virtual_inbound(model_with(*docs), DB)
    tcp = chain(listener, 3306)
    # Metadata exchange first (an Istio proxy's inbound chain), then DENY and ALLOW.
    assert [f.name for f in tcp.filters] == [
        "istio.metadata_exchange",
        "envoy.filters.network.rbac",
        "envoy.filters.network.rbac",
        "envoy.filters.network.tcp_proxy",
    ]
    configs = []
    for f in tcp.filters[1:3]:
        out = tcp_rbac_pb2.RBAC()
        f.typed_config.Unpack(out)
        configs.append(out)
    deny, allow = configs
    assert deny.stat_prefix == "tcp."
    assert as_dict(deny.rules.policies["ns[default]-policy[deny-path]-rule[0]"]) == {
        "permissions": [{"andRules": {"rules": [{"any": True}]}}],
        "principals": [
            {
                "andIds": {
                    "ids": [
                        {
                            "orIds": {
                                "ids": [
                                    {
                                        "authenticated": {
                                            "principalName": {"safeRegex": {"regex": ".*/ns/bad/.*"}}
                                        }
                                    }
                                ]
                            }
                        }
                    ]
                }
            }
        ],
    }
    assert allow.rules.action == rbac_pb2.RBAC.ALLOW
    assert len(allow.rules.policies) == 0


def test_custom_without_a_usable_provider_fails_closed_and_is_counted() -> None:
    doc = policy(
        "ext",
        {
            "action": "CUSTOM",
            "provider": {"name": "my-authz"},
            "rules": [{"to": [{"operation": {"paths": ["/x"]}}]}],
        },
    )
    before = PROBLEMS.count("AuthorizationPolicy", "default/ext")
    filters = http_filters(virtual_inbound(model_with(doc)), 9080)
    rbac = [http_rbac(f) for f in filters if "rbac" in f.name]
    assert len(rbac) == 1
    assert rbac[0].rules.action == rbac_pb2.RBAC.DENY
    assert list(rbac[0].rules.policies) == [
        "istio-ext-authz-my-authz-ns[default]-policy[ext]-rule[0]-deny-due-to-bad-CUSTOM-action"
    ]
    assert PROBLEMS.count("AuthorizationPolicy", "default/ext") > before


def test_not_values_principal_wildcards_and_ip_blocks() -> None:
    doc = policy(
        "mixed",
        {
            "action": "DENY",
            "rules": [
                {
                    "from": [
                        {
                            "source": {
                                "notPrincipals": ["*/sa/admin", "cluster.local/*"],
                                "ipBlocks": ["10.0.0.0/8", "192.168.1.1"],
                                "requestPrincipals": ["https://issuer.example/*"],
                            }
                        }
                    ],
                    "when": [
                        {"key": "request.auth.claims[groups]", "values": ["admins"]},
                        {"key": "destination.port", "notValues": ["9080"]},
                    ],
                }
            ],
        },
    )
    rules = http_rbac(
        next(f for f in http_filters(virtual_inbound(model_with(doc)), 9080) if "rbac" in f.name)
    )
    got = as_dict(rules.rules.policies["ns[default]-policy[mixed]-rule[0]"])
    ids = got["principals"][0]["andIds"]["ids"]
    assert ids[0] == {
        "notId": {
            "orIds": {
                "ids": [
                    {"authenticated": {"principalName": {"safeRegex": {"regex": "spiffe://.*/sa/admin"}}}},
                    {"authenticated": {"principalName": {"prefix": "spiffe://cluster.local/"}}},
                ]
            }
        }
    }
    iss_sub = ids[1]["andIds"]["ids"]
    assert iss_sub[0]["metadata"]["path"] == [{"key": "payload"}, {"key": "iss"}]
    assert iss_sub[0]["metadata"]["value"]["stringMatch"] == {"exact": "https://issuer.example"}
    assert iss_sub[1]["metadata"]["value"]["stringMatch"] == {"safeRegex": {"regex": ".+"}}
    assert ids[2] == {
        "orIds": {
            "ids": [
                {"directRemoteIp": {"addressPrefix": "10.0.0.0", "prefixLen": 8}},
                {"directRemoteIp": {"addressPrefix": "192.168.1.1", "prefixLen": 32}},
            ]
        }
    }
    claim = ids[3]["metadata"]
    assert claim["filter"] == "envoy.filters.http.jwt_authn"
    assert claim["path"] == [{"key": "payload"}, {"key": "groups"}]
    assert claim["value"]["orMatch"]["valueMatchers"][1] == {"stringMatch": {"exact": "admins"}}
    assert got["permissions"][0]["andRules"]["rules"] == [
        {"notRule": {"orRules": {"rules": [{"destinationPort": 9080}]}}}
    ]


def test_a_policy_change_reaches_the_cached_inbound_listener() -> None:
    model = model_with()
    before = [f.name for f in http_filters(virtual_inbound(model), 9080)]
    assert "envoy.filters.http.rbac" not in before
    from meshpilot.config.decode import decode_object

    obj = decode_object(policy("deny-all", {"action": "DENY", "rules": [{}]})).obj
    model.env.store.upsert(obj)
    model.push = model.env.build_push_context("test/2")
    after = [f.name for f in http_filters(virtual_inbound(model), 9080)]
    assert "envoy.filters.http.rbac" in after
