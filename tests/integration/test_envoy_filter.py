"""EnvoyFilter patches change real traffic through a real Envoy, and go away with the filter.

A client sidecar (INTERCEPTION_MODE NONE, egress bound to its own address) calls reviews. An
EnvoyFilter then inserts a Lua HTTP filter before the router (it adds a response header), merges a
response header into the route configuration, and puts a direct-response route first: each shows
in the answer, which proves Envoy accepted the patched listener and route configuration. Deleting
the filter takes all of it away again (the push follows EnvoyFilter changes).
"""

from __future__ import annotations

import json

import pytest
from integration.conftest import MeshHarness
from support.envoy_filters import envoy_filter
from support.kube import egress_sidecar, namespace, workload
from support.processes import http_get
from support.wait import eventually

pytestmark = [pytest.mark.envoy, pytest.mark.integration]

CLIENT_IP = "127.0.0.11"
PORT = 9080
HCM = "envoy.filters.network.http_connection_manager"
LUA = """
function envoy_on_response(handle)
  handle:headers():add("x-envoyfilter-lua", "added")
end
"""


def _patches() -> list[dict[str, object]]:
    return [
        {
            "applyTo": "HTTP_FILTER",
            "match": {
                "context": "SIDECAR_OUTBOUND",
                "listener": {
                    "portNumber": PORT,
                    "filterChain": {
                        "filter": {"name": HCM, "subFilter": {"name": "envoy.filters.http.router"}}
                    },
                },
            },
            "patch": {
                "operation": "INSERT_BEFORE",
                "value": {
                    "name": "test.lua",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
                        "default_source_code": {"inline_string": LUA},
                    },
                },
            },
        },
        {
            "applyTo": "ROUTE_CONFIGURATION",
            "match": {"context": "SIDECAR_OUTBOUND", "routeConfiguration": {"portNumber": PORT}},
            "patch": {
                "operation": "MERGE",
                "value": {
                    "response_headers_to_add": [{"header": {"key": "x-route-patched", "value": "yes"}}]
                },
            },
        },
        {
            "applyTo": "HTTP_ROUTE",
            "match": {
                "context": "SIDECAR_OUTBOUND",
                "routeConfiguration": {"vhost": {"name": f"reviews.default.svc.cluster.local:{PORT}"}},
            },
            "patch": {
                "operation": "INSERT_FIRST",
                "value": {
                    "name": "patched-health",
                    "match": {"path": "/patched-health"},
                    "direct_response": {"status": 203, "body": {"inline_string": "from the envoyfilter"}},
                },
            },
        },
    ]


def _call(path: str = "/") -> tuple[int, str, dict[str, str]]:
    status, body, headers = http_get(CLIENT_IP, PORT, path, {"Host": "reviews.default.svc.cluster.local"})
    try:
        name = str(json.loads(body).get("name", ""))
    except ValueError:
        name = body.decode(errors="replace")
    return status, name, headers


def test_an_envoy_filter_changes_traffic_and_its_removal_restores_it(mesh: MeshHarness) -> None:
    mesh.write("namespace.yaml", [namespace("default")])
    mesh.write("client.yaml", workload("client", "default", "10.96.0.10", PORT, {"client-1": CLIENT_IP}))
    mesh.write(
        "reviews.yaml", workload("reviews", "default", "10.96.0.20", PORT, {"reviews-1": "127.0.0.21"})
    )
    mesh.write("sidecar.yaml", [egress_sidecar("client", CLIENT_IP)])
    mesh.backend("reviews-1", "127.0.0.21", PORT)
    mesh.start_meshpilot()
    mesh.sidecar("client-1", CLIENT_IP, labels={"app": "client"}, service_account="client")

    eventually(lambda: _call()[:2] == (200, "reviews-1"), timeout=30, what="reviews routed")
    _, _, headers = _call()
    assert "x-envoyfilter-lua" not in headers and "x-route-patched" not in headers

    mesh.write(
        "envoyfilter.yaml",
        [envoy_filter("client-patches", "default", _patches(), selector={"app": "client"})],
    )
    # The listener (Lua) and the route (its patch) are two resources pushed one after the other, and
    # Envoy may serve a request between applying them: wait for both.
    eventually(
        lambda: {"x-envoyfilter-lua", "x-route-patched"} <= set(_call()[2]),
        timeout=30,
        what="the Lua filter and the route patch pushed",
    )
    status, name, headers = _call()
    assert (status, name) == (200, "reviews-1")
    assert headers["x-envoyfilter-lua"] == "added"
    assert headers["x-route-patched"] == "yes"
    assert _call("/patched-health")[:2] == (203, "from the envoyfilter")

    mesh.remove("envoyfilter.yaml")
    eventually(
        lambda: not {"x-envoyfilter-lua", "x-route-patched"} & set(_call()[2]),
        timeout=30,
        what="both patches withdrawn",
    )
    status, name, headers = _call()
    assert (status, name) == (200, "reviews-1")
    assert "x-route-patched" not in headers
    assert _call("/patched-health")[:2] == (200, "reviews-1")
