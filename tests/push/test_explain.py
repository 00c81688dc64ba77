"""Push explanation in a server of this process: the objects behind a sidecar's inbound listener and a
gateway's listeners, routes and clusters, and why a change does or does not concern a proxy, under
the rule pushes apply."""

from __future__ import annotations

import shutil
from pathlib import Path

from support.ads_recorder import Recorder
from support.golden import agent_metadata
from support.xds_server import running, settings_for

from meshpilot.model.config import ConfigKey
from meshpilot.model.kind import Kind
from meshpilot.model.proxy import Proxy
from meshpilot.model.push_context import PushContext
from meshpilot.model.push_request import PushRequest
from meshpilot.push.explain import pushes, resource, why_in_scope
from meshpilot.xds.dependencies import proxy_needs_push
from meshpilot.xds.types import TypeUrl

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


GATEWAY = "router~10.1.0.100~gw-1.istio-system~istio-system.svc.cluster.local"
GATEWAY_METADATA = {
    "LABELS": {"istio": "ingressgateway"},
    "SERVICE_ACCOUNT": "istio-ingressgateway-service-account",
}
#: Route patches of a gateway match the Gateway's port (80), listener patches the port listened on
#: (8080, the Service's targetPort), as istiod matches them; the filter on port 80 touches no listener.
GATEWAY_FILTERS = """
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: gw-tuning, namespace: istio-system}
spec:
  workloadSelector: {labels: {istio: ingressgateway}}
  configPatches:
  - applyTo: VIRTUAL_HOST
    match: {context: GATEWAY, routeConfiguration: {portNumber: 80}}
    patch: {operation: MERGE, value: {include_request_attempt_count: false}}
  - applyTo: LISTENER
    match: {context: GATEWAY, listener: {portNumber: 8080}}
    patch: {operation: MERGE, value: {per_connection_buffer_limit_bytes: 32768}}
---
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: gw-port-80, namespace: istio-system}
spec:
  workloadSelector: {labels: {istio: ingressgateway}}
  configPatches:
  - applyTo: LISTENER
    match: {context: GATEWAY, listener: {portNumber: 80}}
    patch: {operation: MERGE, value: {per_connection_buffer_limit_bytes: 1024}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: default}
spec:
  host: reviews
  trafficPolicy: {connectionPool: {tcp: {maxConnections: 50}}}
"""


def _case(tmp_path: Path, case: str, extra: str = "") -> Path:
    config = tmp_path / "config"
    config.mkdir(parents=True)
    shutil.copy(CASE.parent / case / "config.yaml", config / "config.yaml")
    if extra:
        (config / "extra.yaml").write_text(extra)
    return config


def _verdicts(proxy: Proxy, push: PushContext, cases: dict[ConfigKey, str]) -> None:
    for key, words in cases.items():
        concerned, why = why_in_scope(proxy, key, push)
        request = PushRequest(full=True, configs_updated=frozenset({key}))
        assert concerned == proxy_needs_push(proxy, request, push.mesh.root_namespace), key
        assert words in why, (key, why)


async def test_a_gateway_listener_route_and_cluster_and_why_changes_reach_it(tmp_path: Path) -> None:
    async with running(settings_for(_case(tmp_path, "gateway", GATEWAY_FILTERS))) as app:
        recorder = Recorder(
            str(app.settings.grpc_addr), GATEWAY, agent_metadata(GATEWAY, GATEWAY_METADATA), delta=True
        )
        await recorder.subscribe()
        try:
            (conn,) = app.server.connections.values()
            push = app.server.push_context
            assert push is not None
            # What the explanation is asked about is what the gateway holds.
            assert set(recorder.held[TypeUrl.LISTENER]) == {"0.0.0.0_8080"}
            assert set(recorder.held[TypeUrl.ROUTE]) == {"http.8080"}

            listener = resource(conn, push, app.index, "lds/0.0.0.0_8080")
            (server,) = listener["servers"]
            assert server["gateway"] == "default/bookinfo-gateway"
            assert (server["port"], server["listenPort"], server["route"]) == (80, 8080, "http.8080")
            assert server["virtualServices"] == ["default/bookinfo"]
            assert listener["envoyFilters"] == ["EnvoyFilter istio-system/gw-tuning (LISTENER MERGE)"]

            route = resource(conn, push, app.index, "rds/http.8080")
            assert [s["gateway"] for s in route["servers"]] == ["default/bookinfo-gateway"]
            # other/other-shop names the Gateway too, but the server admits *.shop.example.com only
            # from namespace default.
            assert route["virtualServices"] == [
                {
                    "name": "default/bookinfo",
                    "gateways": ["default/bookinfo-gateway"],
                    "hosts": ["bookinfo.example.com", "cart.shop.example.com"],
                    "exportTo": ["*"],
                }
            ]
            assert route["envoyFilters"] == ["EnvoyFilter istio-system/gw-tuning (VIRTUAL_HOST MERGE)"]
            assert "no server" in resource(conn, push, app.index, "rds/http.9999")["from"]

            cluster = resource(conn, push, app.index, "cds/outbound|9080||reviews.default.svc.cluster.local")
            assert cluster["service"]["name"] == "reviews"
            assert cluster["destinationRules"] == ["DestinationRule default/reviews"]
            assert cluster["routedBy"] == [
                "VirtualService default/bookinfo (Gateway default/bookinfo-gateway)"
            ]
            unused = resource(
                conn, push, app.index, "cds/outbound|80||istio-ingressgateway.istio-system.svc.cluster.local"
            )
            assert unused["routedBy"] == []
            endpoints = resource(
                conn, push, app.index, "eds/outbound|9080||reviews.default.svc.cluster.local"
            )
            assert [s["endpoints"] for s in endpoints["sources"]] == [1]

            _verdicts(
                conn.proxy,
                push,
                {
                    ConfigKey(
                        Kind.GATEWAY, "bookinfo-gateway", "default"
                    ): "selects it (selector istio=ingressgateway",
                    ConfigKey(Kind.GATEWAY, "gone", "elsewhere"): "is gone",
                    ConfigKey(Kind.VIRTUAL_SERVICE, "bookinfo", "default"): (
                        "serves bookinfo.example.com, cart.shop.example.com on port 80 of Gateway "
                        "default/bookinfo-gateway (route http.8080)"
                    ),
                    ConfigKey(Kind.VIRTUAL_SERVICE, "other-shop", "other"): (
                        "is bound to Gateway default/bookinfo-gateway, whose port 80 server admits none"
                    ),
                    ConfigKey(Kind.SERVICE_ENTRY, "reviews.default.svc.cluster.local", "default"): (
                        "a destination of VirtualService default/bookinfo, "
                        "bound to Gateway default/bookinfo-gateway"
                    ),
                    ConfigKey(Kind.DESTINATION_RULE, "reviews", "default"): (
                        "DestinationRule default/reviews applies to reviews.default.svc.cluster.local, a "
                        "destination of VirtualService default/bookinfo, "
                        "bound to Gateway default/bookinfo-gateway; "
                        "and the default scope of namespace istio-system (gateways take no Sidecar) imports"
                    ),
                    ConfigKey(Kind.AUTHORIZATION_POLICY, "x", "default"): "neither the proxy's nor the root",
                },
            )
            explained = pushes(app.server.history, conn, conn.proxy.id, push)
            assert (
                explained["scope"] == "the default scope of namespace istio-system (gateways take no Sidecar)"
            )
            assert explained["gateways"] == [
                {"name": "default/bookinfo-gateway", "selector": {"istio": "ingressgateway"}, "ports": [80]}
            ]
        finally:
            await recorder.close()


async def test_a_gateway_terminating_tls_and_its_policies(tmp_path: Path) -> None:
    async with running(settings_for(_case(tmp_path, "gateway-tls"))) as app:
        recorder = Recorder(
            str(app.settings.grpc_addr), GATEWAY, agent_metadata(GATEWAY, GATEWAY_METADATA), delta=True
        )
        await recorder.subscribe()
        try:
            (conn,) = app.server.connections.values()
            push = app.server.push_context
            assert push is not None
            listener = resource(conn, push, app.index, "lds/0.0.0.0_8443")
            assert [(s["route"], s["tlsMode"], s.get("credentialNames")) for s in listener["servers"]] == [
                ("https.443.https-simple.secure.istio-system", "SIMPLE", ["bookinfo-cert"]),
                ("https.443.https-mutual.secure.istio-system", "MUTUAL", ["admin-cert"]),
            ]
            tcp = resource(conn, push, app.index, "lds/0.0.0.0_3307")
            (db,) = tcp["servers"]
            assert (db["protocol"], db["tlsMode"], db["credentialNames"]) == ("TLS", "SIMPLE", ["db-cert"])
            assert "route" not in db and db["virtualServices"] == ["default/db"]
            # The "*" server admits db.example.com too, but VirtualService db has only tcp routes.
            files = resource(conn, push, app.index, "rds/https.9443.https-files.secure.istio-system")
            assert [vs["name"] for vs in files["virtualServices"]] == ["default/bookinfo"]
            assert files["servers"][0]["tlsMode"] == "OPTIONAL_MUTUAL"
            _verdicts(
                conn.proxy,
                push,
                {
                    ConfigKey(Kind.SECRET, "bookinfo-cert", "istio-system"): (
                        "credentialName bookinfo-cert of the SIMPLE server on port 443 "
                        "of Gateway istio-system/secure"
                    ),
                    # The CA of a MUTUAL server is the -cacert twin of its credential.
                    ConfigKey(
                        Kind.SECRET, "admin-cert-cacert", "istio-system"
                    ): "of the MUTUAL server on port 443",
                    ConfigKey(Kind.SECRET, "bookinfo-cert", "default"): "SDS sends it only to those that do",
                    ConfigKey(Kind.VIRTUAL_SERVICE, "db", "default"): (
                        "serves db.example.com on port 3307 of Gateway istio-system/secure "
                        "(listener 0.0.0.0_3307)"
                    ),
                },
            )
        finally:
            await recorder.close()

    async with running(settings_for(_case(tmp_path / "authz", "gateway-authz"))) as app:
        recorder = Recorder(
            str(app.settings.grpc_addr), GATEWAY, agent_metadata(GATEWAY, GATEWAY_METADATA), delta=True
        )
        await recorder.subscribe()
        try:
            (conn,) = app.server.connections.values()
            push = app.server.push_context
            assert push is not None
            for name in recorder.held[TypeUrl.LISTENER]:
                found = resource(conn, push, app.index, f"lds/{name}")
                assert found["authorizationPolicies"] == {
                    "DENY": ["AuthorizationPolicy istio-system/deny-blocked"],
                    "ALLOW": ["AuthorizationPolicy istio-system/allow-ingress"],
                    "AUDIT": ["AuthorizationPolicy istio-system/audit-reports"],
                }, name
                assert found["requestAuthentications"] == ["RequestAuthentication istio-system/gateway-jwt"]
        finally:
            await recorder.close()
