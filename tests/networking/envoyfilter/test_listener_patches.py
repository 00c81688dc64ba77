"""LISTENER, LISTENER_FILTER, FILTER_CHAIN, NETWORK_FILTER and HTTP_FILTER patches as istiod applies them."""

from __future__ import annotations

from typing import Any

from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.http.lua.v3 import lua_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.listener.tls_inspector.v3 import tls_inspector_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from support.envoy_filters import as_dict, message, patch_set

from meshpilot.networking.envoyfilter import listeners
from meshpilot.networking.envoyfilter.patches import Context

HCM = "envoy.filters.network.http_connection_manager"
OUT, IN, GW = Context.SIDECAR_OUTBOUND, Context.SIDECAR_INBOUND, Context.GATEWAY
HCM_TYPE = "type.googleapis.com/" + hcm_pb2.HttpConnectionManager.DESCRIPTOR.full_name
ROUTER_TYPE = "type.googleapis.com/" + router_pb2.Router.DESCRIPTOR.full_name
LUA_TYPE = "type.googleapis.com/" + lua_pb2.Lua.DESCRIPTOR.full_name
TCP_TYPE = "type.googleapis.com/" + tcp_proxy_pb2.TcpProxy.DESCRIPTOR.full_name
TLS_INSPECTOR_TYPE = "type.googleapis.com/" + tls_inspector_pb2.TlsInspector.DESCRIPTOR.full_name


def hcm_filter(*http_filters: str) -> dict[str, Any]:
    return {
        "name": HCM,
        "typed_config": {
            "@type": HCM_TYPE,
            "stat_prefix": "outbound_0.0.0.0_9080",
            "http_filters": [
                {"name": n, "typed_config": {"@type": ROUTER_TYPE}}
                if n == "envoy.filters.http.router"
                else {
                    "name": n,
                    "typed_config": {"@type": LUA_TYPE, "default_source_code": {"inline_string": n}},
                }
                for n in http_filters
            ],
        },
    }


def tcp_filter(cluster: str) -> dict[str, Any]:
    return {
        "name": "envoy.filters.network.tcp_proxy",
        "typed_config": {"@type": TCP_TYPE, "stat_prefix": cluster, "cluster": cluster},
    }


def http_listener() -> Any:
    return message(
        listener_pb2.Listener,
        {
            "name": "0.0.0.0_9080",
            "address": {"socket_address": {"address": "0.0.0.0", "port_value": 9080}},
            "listener_filters": [
                {
                    "name": "envoy.filters.listener.tls_inspector",
                    "typed_config": {"@type": TLS_INSPECTOR_TYPE},
                }
            ],
            "filter_chains": [
                {
                    "filter_chain_match": {
                        "transport_protocol": "raw_buffer",
                        "application_protocols": ["http/1.1", "h2c"],
                    },
                    "filters": [hcm_filter("a", "b", "envoy.filters.http.router")],
                }
            ],
            "default_filter_chain": {
                "name": "PassthroughFilterChain",
                "filters": [tcp_filter("PassthroughCluster")],
            },
        },
    )


def virtual_inbound() -> Any:
    return message(
        listener_pb2.Listener,
        {
            "name": "virtualInbound",
            "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15006}},
            "filter_chains": [
                {
                    "name": "0.0.0.0_8000",
                    "filter_chain_match": {"destination_port": 8000, "transport_protocol": "tls"},
                    "filters": [tcp_filter("inbound|8000||")],
                },
                {
                    "name": "0.0.0.0_9080",
                    "filter_chain_match": {"destination_port": 9080, "server_names": ["a.com"]},
                    "filters": [hcm_filter("envoy.filters.http.router")],
                },
            ],
        },
    )


def http_filter_names(listener: Any, chain: int = 0) -> list[str]:
    hcm = hcm_pb2.HttpConnectionManager()
    listener.filter_chains[chain].filters[0].typed_config.Unpack(hcm)
    return [f.name for f in hcm.http_filters]


def run(listener: Any, *patches: dict[str, Any], context: int = OUT) -> Any:
    removed = listeners.patch_listener(listener, patch_set(*patches), context)
    return None if removed else listener


def http(operation: str, value: Any = None, sub_filter: str = "", **listener_match: Any) -> dict[str, Any]:
    match: dict[str, Any] = {"context": "SIDECAR_OUTBOUND", "listener": dict(listener_match)}
    chain = match["listener"].setdefault("filterChain", {})
    chain.setdefault("filter", {"name": HCM})
    if sub_filter:
        chain["filter"]["subFilter"] = {"name": sub_filter}
    patch: dict[str, Any] = {"operation": operation}
    if value is not None:
        patch["value"] = value
    return {"applyTo": "HTTP_FILTER", "match": match, "patch": patch}


LUA = {"name": "my.lua", "typed_config": {"@type": LUA_TYPE, "default_source_code": {"inline_string": "x"}}}


# -- LISTENER ------------------------------------------------------------------------------------


def test_listener_merge_and_remove_match_by_name_and_port() -> None:
    merge = {
        "applyTo": "LISTENER",
        "match": {"listener": {"portNumber": 9080}},
        "patch": {"operation": "MERGE", "value": {"per_connection_buffer_limit_bytes": 1024}},
    }
    assert run(http_listener(), merge).per_connection_buffer_limit_bytes.value == 1024
    other_port = {**merge, "match": {"listener": {"portNumber": 9081}}}
    assert not run(http_listener(), other_port).HasField("per_connection_buffer_limit_bytes")
    remove = {
        "applyTo": "LISTENER",
        "match": {"listener": {"name": "0.0.0.0_9080"}},
        "patch": {"operation": "REMOVE"},
    }
    assert run(http_listener(), remove) is None
    assert run(virtual_inbound(), remove) is not None


def test_listener_add_obeys_the_context() -> None:
    add = {"applyTo": "LISTENER", "patch": {"operation": "ADD", "value": {"name": "extra"}}}
    assert [li.name for li in listeners.added_listeners(patch_set(add), OUT)] == ["extra"]
    assert listeners.added_listeners(patch_set(add), IN) == []
    inbound = {**add, "match": {"context": "SIDECAR_INBOUND"}}
    assert [li.name for li in listeners.added_listeners(patch_set(inbound), IN)] == ["extra"]
    assert listeners.added_listeners(patch_set(inbound), GW) == []


def test_a_listener_name_match_skips_other_listeners_without_parsing() -> None:
    patches = patch_set(
        {"applyTo": "LISTENER", "match": {"listener": {"name": "x"}}, "patch": {"operation": "REMOVE"}}
    )
    assert listeners.may_touch("x", patches, OUT)
    assert not listeners.may_touch("y", patches, OUT)
    assert listeners.may_touch("y", patch_set({"applyTo": "LISTENER", "patch": {"operation": "REMOVE"}}), OUT)


# -- LISTENER_FILTER -----------------------------------------------------------------------------


def test_listener_filters_take_list_operations() -> None:
    inspector = "envoy.filters.listener.tls_inspector"
    value = {"name": "envoy.filters.listener.http_inspector"}
    first = {"applyTo": "LISTENER_FILTER", "patch": {"operation": "INSERT_FIRST", "value": value}}
    assert [f.name for f in run(http_listener(), first).listener_filters] == [value["name"], inspector]
    after = {
        "applyTo": "LISTENER_FILTER",
        "match": {"listener": {"listenerFilter": inspector}},
        "patch": {"operation": "INSERT_AFTER", "value": value},
    }
    assert [f.name for f in run(http_listener(), after).listener_filters] == [inspector, value["name"]]
    remove = {**after, "patch": {"operation": "REMOVE"}}
    assert list(run(http_listener(), remove).listener_filters) == []


# -- FILTER_CHAIN ---------------------------------------------------------------------------------


def test_filter_chain_match_fields() -> None:
    def removes(**chain_match: Any) -> list[str]:
        patch = {
            "applyTo": "FILTER_CHAIN",
            "match": {"listener": {"name": "virtualInbound", "filterChain": chain_match}},
            "patch": {"operation": "REMOVE"},
        }
        return [c.name for c in run(virtual_inbound(), patch, context=IN).filter_chains]

    assert removes(name="0.0.0.0_8000") == ["0.0.0.0_9080"]
    assert removes(sni="a.com") == ["0.0.0.0_8000"]
    assert removes(transportProtocol="tls") == ["0.0.0.0_9080"]
    assert removes(destinationPort=9080) == ["0.0.0.0_8000"]
    assert removes(sni="b.com") == ["0.0.0.0_8000", "0.0.0.0_9080"]
    assert removes(applicationProtocols="h2c") == ["0.0.0.0_8000", "0.0.0.0_9080"]


def test_application_protocols_must_all_be_present() -> None:
    def kept(protocols: str) -> int:
        patch = {
            "applyTo": "FILTER_CHAIN",
            "match": {"listener": {"filterChain": {"applicationProtocols": protocols}}},
            "patch": {"operation": "REMOVE"},
        }
        return len(run(http_listener(), patch).filter_chains)

    assert kept("http/1.1,h2c") == 0
    assert kept("http/1.1,h2") == 1


def test_on_virtual_listeners_the_port_selects_filter_chains() -> None:
    patch = {
        "applyTo": "FILTER_CHAIN",
        "match": {"listener": {"portNumber": 8000}},
        "patch": {"operation": "REMOVE"},
    }
    assert [c.name for c in run(virtual_inbound(), patch).filter_chains] == ["0.0.0.0_9080"]


def test_filter_chain_merge_and_add_and_default_chain_removal() -> None:
    merge = {
        "applyTo": "FILTER_CHAIN",
        "match": {"listener": {"portNumber": 9080}},
        "patch": {"operation": "MERGE", "value": {"name": "merged"}},
    }
    patched = run(http_listener(), merge)
    assert patched.filter_chains[0].name == "merged"
    assert patched.default_filter_chain.name == "merged"
    add = {
        "applyTo": "FILTER_CHAIN",
        "match": {"listener": {"portNumber": 9080}},
        "patch": {"operation": "ADD", "value": {"name": "added", "filters": [tcp_filter("x")]}},
    }
    assert [c.name for c in run(http_listener(), add).filter_chains] == ["", "added"]
    remove = {
        "applyTo": "FILTER_CHAIN",
        "match": {"listener": {"filterChain": {"name": "PassthroughFilterChain"}}},
        "patch": {"operation": "REMOVE"},
    }
    patched = run(http_listener(), remove)
    assert not patched.HasField("default_filter_chain")
    assert len(patched.filter_chains) == 1


# -- NETWORK_FILTER --------------------------------------------------------------------------------


def network(operation: str, value: Any = None, name: str = "") -> dict[str, Any]:
    listener: dict[str, Any] = {"portNumber": 9080}
    if name:
        listener["filterChain"] = {"filter": {"name": name}}
    patch: dict[str, Any] = {"operation": operation}
    if value is not None:
        patch["value"] = value
    return {"applyTo": "NETWORK_FILTER", "match": {"listener": listener}, "patch": patch}


RBAC = {"name": "envoy.filters.network.rbac"}


def chain_filters(listener: Any) -> list[str]:
    return [f.name for f in listener.filter_chains[0].filters]


def test_network_filter_list_operations() -> None:
    assert chain_filters(run(http_listener(), network("INSERT_BEFORE", RBAC, HCM))) == [RBAC["name"], HCM]
    assert chain_filters(run(http_listener(), network("INSERT_AFTER", RBAC, HCM))) == [HCM, RBAC["name"]]
    assert chain_filters(run(http_listener(), network("INSERT_FIRST", RBAC))) == [RBAC["name"], HCM]
    assert chain_filters(run(http_listener(), network("ADD", RBAC))) == [HCM, RBAC["name"]]
    # Without a filter match: INSERT_BEFORE goes first, INSERT_AFTER last, REPLACE and REMOVE do nothing.
    assert chain_filters(run(http_listener(), network("INSERT_BEFORE", RBAC))) == [RBAC["name"], HCM]
    assert chain_filters(run(http_listener(), network("INSERT_AFTER", RBAC))) == [HCM, RBAC["name"]]
    assert chain_filters(run(http_listener(), network("REMOVE"))) == [HCM]
    assert chain_filters(run(http_listener(), network("REPLACE", RBAC))) == [HCM]
    # With one that matches nothing, nothing happens.
    assert chain_filters(run(http_listener(), network("INSERT_BEFORE", RBAC, "nope"))) == [HCM]
    assert chain_filters(run(http_listener(), network("REPLACE", RBAC, HCM))) == [RBAC["name"]]
    removed = run(http_listener(), network("REMOVE", name=HCM))
    # A chain left without filters is dropped; the default chain is another chain.
    assert len(removed.filter_chains) == 0


def test_network_filter_merge_merges_the_typed_config_and_may_rename() -> None:
    value = {
        "name": "renamed",
        "typed_config": {"@type": TCP_TYPE, "idle_timeout": "5s"},
    }
    patch = network("MERGE", value, "envoy.filters.network.tcp_proxy")
    patched = run(http_listener(), patch)
    default = patched.default_filter_chain.filters[0]
    assert default.name == "renamed"
    config = tcp_proxy_pb2.TcpProxy()
    default.typed_config.Unpack(config)
    assert config.cluster == "PassthroughCluster"
    assert config.idle_timeout.seconds == 5


# -- HTTP_FILTER -----------------------------------------------------------------------------------


def test_http_filter_list_operations() -> None:
    router = "envoy.filters.http.router"
    assert http_filter_names(run(http_listener(), http("INSERT_BEFORE", LUA, router))) == [
        "a",
        "b",
        "my.lua",
        router,
    ]
    assert http_filter_names(run(http_listener(), http("INSERT_AFTER", LUA, "a"))) == [
        "a",
        "my.lua",
        "b",
        router,
    ]
    assert http_filter_names(run(http_listener(), http("INSERT_FIRST", LUA, "b"))) == [
        "my.lua",
        "a",
        "b",
        router,
    ]
    assert http_filter_names(run(http_listener(), http("ADD", LUA))) == ["a", "b", router, "my.lua"]
    assert http_filter_names(run(http_listener(), http("REPLACE", LUA, "b"))) == ["a", "my.lua", router]
    assert http_filter_names(run(http_listener(), http("REMOVE", sub_filter="a"))) == ["b", router]
    assert http_filter_names(run(http_listener(), http("INSERT_BEFORE", LUA))) == ["my.lua", "a", "b", router]
    assert http_filter_names(run(http_listener(), http("REMOVE"))) == ["a", "b", router]


def test_http_filter_merge_merges_the_typed_config_of_the_same_type() -> None:
    value = {"typed_config": {"@type": LUA_TYPE, "stat_prefix": "merged"}}
    patched = run(http_listener(), http("MERGE", value, "b"))
    hcm = hcm_pb2.HttpConnectionManager()
    patched.filter_chains[0].filters[0].typed_config.Unpack(hcm)
    lua = lua_pb2.Lua()
    hcm.http_filters[1].typed_config.Unpack(lua)
    assert lua.stat_prefix == "merged"
    assert lua.default_source_code.inline_string == "b"
    # Others are untouched.
    hcm.http_filters[0].typed_config.Unpack(lua)
    assert lua.stat_prefix == ""


def test_http_filter_merge_of_another_type_fails_alone_and_is_counted() -> None:
    from meshpilot.networking.envoyfilter.problems import PATCH_PROBLEMS

    before = PATCH_PROBLEMS.count("EnvoyFilter", "default/test")
    value = {"typed_config": {"@type": ROUTER_TYPE}}
    patched = run(http_listener(), http("MERGE", value, "b"), http("REMOVE", sub_filter="a"))
    assert http_filter_names(patched) == ["b", "envoy.filters.http.router"]
    assert PATCH_PROBLEMS.count("EnvoyFilter", "default/test") == before + 1


def test_http_filters_of_one_port_of_virtual_inbound_only() -> None:
    patch = http("ADD", LUA, portNumber=9080)
    patch["match"]["context"] = "SIDECAR_INBOUND"
    patched = run(virtual_inbound(), patch, context=IN)
    assert http_filter_names(patched, 1) == ["envoy.filters.http.router", "my.lua"]
    assert as_dict(patched)["filter_chains"][0]["filters"][0]["name"] == "envoy.filters.network.tcp_proxy"
    # The patch's context is SIDECAR_INBOUND: an outbound listener is left alone.
    assert http_filter_names(run(http_listener(), patch)) == ["a", "b", "envoy.filters.http.router"]
