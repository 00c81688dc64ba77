"""Push explanation in a server of this process: the objects behind an inbound listener, and why a
change does or does not concern a proxy, under the rule pushes apply."""

from __future__ import annotations

import shutil
from pathlib import Path

from support.ads_recorder import Recorder
from support.golden import agent_metadata
from support.xds_server import running, settings_for

from meshpilot.model.config import ConfigKey
from meshpilot.model.kind import Kind
from meshpilot.model.push_request import PushRequest
from meshpilot.push.explain import resource, why_in_scope
from meshpilot.xds.dependencies import proxy_needs_push

CASE = Path(__file__).parents[1] / "golden" / "cases" / "authz-deny-allow"
API = "sidecar~10.1.0.51~api-1.default~default.svc.cluster.local"


async def test_the_inbound_listener_and_the_scope_of_policies(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir()
    shutil.copy(CASE / "config.yaml", config / "config.yaml")
    async with running(settings_for(config)) as app:
        recorder = Recorder(
            str(app.settings.grpc_addr),
            API,
            agent_metadata(API, {"LABELS": {"app": "api", "version": "v1"}}),
            delta=True,
        )
        await recorder.subscribe()
        try:
            (conn,) = app.server.connections.values()
            push = app.server.push_context
            assert push is not None
            inbound = resource(conn, push, app.index, "lds/virtualInbound")
            assert inbound["authorizationPolicies"] == {
                "DENY": ["AuthorizationPolicy default/deny-admin"],
                "ALLOW": ["AuthorizationPolicy default/allow-client"],
            }
            assert {(s["name"], s["port"]) for s in inbound["services"]} == {
                ("api", 9080),
                ("api", 5432),
                ("api", 8000),
            }
            outbound = resource(conn, push, app.index, "lds/0.0.0.0_80")
            assert "authorizationPolicies" not in outbound

            proxy = conn.proxy
            root = push.mesh.root_namespace
            cases = {
                ConfigKey(Kind.AUTHORIZATION_POLICY, "x", "default"): "the proxy's own namespace default",
                ConfigKey(Kind.AUTHORIZATION_POLICY, "x", root): f"the root namespace {root}",
                ConfigKey(Kind.AUTHORIZATION_POLICY, "x", "elsewhere"): "neither the proxy's nor the root",
                ConfigKey(Kind.GATEWAY, "gw", "default"): "sidecars take no Gateway",
                ConfigKey(Kind.SERVICE_ENTRY, "api.default.svc.cluster.local", "default"): "the proxy serves",
                ConfigKey(Kind.DESTINATION_RULE, "nothing", "elsewhere"): "does not import it",
            }
            for key, words in cases.items():
                concerned, why = why_in_scope(proxy, key, push)
                # The verdict is the push's own rule.
                request = PushRequest(full=True, configs_updated=frozenset({key}))
                assert concerned == proxy_needs_push(proxy, request, root), key
                assert words in why, (key, why)
        finally:
            await recorder.close()


async def test_envoy_filters_behind_a_cluster_a_route_and_a_listener(tmp_path: Path) -> None:
    case = CASE.parent / "envoy-filter"
    config = tmp_path / "config"
    config.mkdir()
    shutil.copy(case / "config.yaml", config / "config.yaml")
    node = "sidecar~10.1.0.10~productpage-v1.default~default.svc.cluster.local"
    async with running(settings_for(config)) as app:
        recorder = Recorder(
            str(app.settings.grpc_addr),
            node,
            agent_metadata(node, {"LABELS": {"app": "productpage", "version": "v1"}}),
            delta=True,
        )
        await recorder.subscribe()
        try:
            (conn,) = app.server.connections.values()
            push = app.server.push_context
            assert push is not None

            def filters(reference: str) -> list[str]:
                found: list[str] = resource(conn, push, app.index, reference)["envoyFilters"]
                return found

            assert filters("cds/outbound|9080||reviews.default.svc.cluster.local") == [
                "EnvoyFilter default/productpage-tuning (CLUSTER MERGE)"
            ]
            assert filters("cds/rate-limit-service") == [
                "EnvoyFilter default/productpage-tuning (CLUSTER ADD)"
            ]
            assert filters("cds/outbound|9080||productpage.default.svc.cluster.local") == []
            route = filters("rds/9080")
            assert "EnvoyFilter default/productpage-tuning (ROUTE_CONFIGURATION MERGE)" in route
            assert "EnvoyFilter default/productpage-tuning (VIRTUAL_HOST MERGE)" in route
            assert set(filters("lds/0.0.0.0_9080")) == {
                "EnvoyFilter istio-system/lua-header (HTTP_FILTER INSERT_BEFORE)",
                "EnvoyFilter default/late-buffer (LISTENER MERGE)",
                "EnvoyFilter default/productpage-tuning (LISTENER MERGE)",
            }
            assert filters("lds/0.0.0.0_3306") == []
        finally:
            await recorder.close()
