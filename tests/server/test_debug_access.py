"""The debug pages as istiod scopes them: loopback callers read everything; others need a token the
xDS authenticators accept, and outside the system namespace see only their own proxies' config
dumps (the rule ``DebugAccess`` also applies over xDS); pushes only from loopback; secrets and extra
node metadata never shown."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from support.ads_client import AdsClient
from support.kube import workload, write
from support.xds_server import running, settings_for

from meshpilot.ca.authenticate import Authenticator, Caller
from meshpilot.server.app import DiscoveryApp
from meshpilot.server.debug_access import SCOPE, debug_access
from meshpilot.server.redaction import REDACTED, adsz_metadata, redact
from meshpilot.xds.debug_access import DebugAccess

UPSTREAM_TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
KEY = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\n"


class _Tokens:
    """An authenticator that knows a few tokens."""

    async def authenticate(
        self, auth: dict[str, list[bytes]], metadata: Sequence[tuple[str, Any]]
    ) -> Caller | None:
        tokens = {
            "Bearer admin": ("spiffe://cluster.local/ns/istio-system/sa/istiod",),
            "Bearer app": ("spiffe://cluster.local/ns/shop/sa/app",),
            "Bearer ops": ("spiffe://cluster.local/ns/ops/sa/oncall",),
            "Bearer bar": ("spiffe://cluster.local/ns/bar/sa/default",),
            "Bearer barprod": ("spiffe://cluster.local/ns/bar-prod-7/sa/default",),
            "Bearer nameless": ("someone@example.com",),
            "Bearer second": ("someone@example.com", "spiffe://cluster.local/ns/istio-system/sa/istiod"),
        }
        for key, value in metadata:
            if key == "authorization" and value in tokens:
                return Caller(tokens[value], "test token")
        return None


def _request(path: str, remote: str, token: str = "") -> web.Request:
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: (
        (remote, 4321) if name == "peername" else default
    )
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return make_mocked_request("GET", path, headers=headers, transport=transport)


#: The rule as istiod ships it: debug auth on, no extra namespaces.
ISTIOD_RULE = DebugAccess()


def _guard(access: DebugAccess) -> Any:
    authenticators: tuple[Authenticator, ...] = (_Tokens(),)
    return debug_access(lambda: authenticators, lambda: "istio-system", access)


async def _scope(path: str, remote: str, token: str = "", access: DebugAccess = ISTIOD_RULE) -> str:
    """The scope the page was given, or the status of the refusal."""

    async def handler(request: web.Request) -> web.Response:
        return web.Response(text=f"scope={request.get(SCOPE)}")

    response = await _guard(access)(_request(path, remote, token), handler)
    assert isinstance(response, web.Response)
    return response.text if response.status == 200 else str(response.status)


@pytest.mark.parametrize(
    ("path", "remote", "token", "outcome"),
    [
        ("/debug/configz", "127.0.0.1", "", "scope="),
        ("/debug/adsz?push=true", "::1", "", "scope="),
        ("/debug/configz", "10.0.0.9", "", "401"),
        ("/debug/configz", "10.0.0.9", "forged", "401"),
        ("/debug/configz", "10.0.0.9", "admin", "scope="),
        ("/debug/adsz?push=true", "10.0.0.9", "admin", "403"),
        ("/debug/configz", "10.0.0.9", "app", "403"),
        ("/debug/syncz", "10.0.0.9", "app", "403"),
        # The page finds proxies only within the scope: another namespace's proxy is not found.
        ("/debug/config_dump?proxyID=productpage-v1.default", "10.0.0.9", "app", "scope=shop"),
        ("/debug/config_dump?proxyID=cart-v1.shop", "10.0.0.9", "app", "scope=shop"),
        # No SPIFFE identity, no namespace to judge; the first SPIFFE identity is the one judged.
        ("/debug/config_dump?proxyID=cart-v1.shop", "10.0.0.9", "nameless", "403"),
        ("/debug/syncz", "10.0.0.9", "second", "scope="),
        ("/ready", "10.0.0.9", "", "scope=None"),
        ("/metrics", "10.0.0.9", "", "scope=None"),
    ],
)
async def test_who_may_read_which_page(path: str, remote: str, token: str, outcome: str) -> None:
    assert await _scope(path, remote, token) == outcome


async def test_allowed_namespaces_and_the_auth_switch_mean_what_they_mean_over_xds() -> None:
    allowed = DebugAccess(allowed_namespaces=frozenset({"ops"}))
    assert await _scope("/debug/syncz", "10.0.0.9", "ops", allowed) == "scope="
    assert await _scope("/debug/syncz", "10.0.0.9", "ops") == "403"
    off = DebugAccess(enabled=False)
    assert await _scope("/debug/configz", "10.0.0.9", "app", off) == "scope="
    assert await _scope("/debug/configz", "10.0.0.9", "", off) == "401"
    assert await _scope("/debug/configz", "10.0.0.9", "nameless", off) == "scope="


def test_redaction_hides_keys_and_tokens_but_not_config() -> None:
    envoy_filter = {
        "metadata": {
            "annotations": {"example.com/api-token": "s3cr3t", "owner": "team-a"},
        },
        "spec": {
            "configPatches": [
                {
                    "patch": {
                        "value": {
                            "tls_certificates": [
                                {
                                    "private_key": {"inline_string": KEY},
                                    "certificate_chain": {"inline_string": "c"},
                                }
                            ],
                            "token_bucket": {"max_tokens": 10},
                            "note": "key: " + KEY,
                        }
                    }
                }
            ],
            "credentialName": "gateway-cert",
        },
    }
    shown = redact(envoy_filter)
    value = shown["spec"]["configPatches"][0]["patch"]["value"]
    assert value["tls_certificates"][0]["private_key"] == REDACTED
    assert value["tls_certificates"][0]["certificate_chain"] == {"inline_string": "c"}
    assert value["note"] == REDACTED
    assert value["token_bucket"] == {"max_tokens": 10}
    assert shown["metadata"]["annotations"] == {"example.com/api-token": REDACTED, "owner": "team-a"}
    assert shown["spec"]["credentialName"] == "gateway-cert"
    assert "PRIVATE KEY" not in str(shown)


def test_adsz_shows_istiods_metadata_fields_only() -> None:
    raw = {"NAMESPACE": "default", "ISTIO_VERSION": "1.28.0", "CUSTOM_BLOB": "x" * 10_000, "DB_PASSWORD": "p"}
    assert adsz_metadata(raw) == {"NAMESPACE": "default", "ISTIO_VERSION": "1.28.0"}


async def test_configz_and_config_dump_over_http_hide_an_inlined_private_key(tmp_path: Path) -> None:
    config = tmp_path / "config"
    filter_ = {
        "apiVersion": "networking.istio.io/v1alpha3",
        "kind": "EnvoyFilter",
        "metadata": {"name": "tls", "namespace": "istio-system", "annotations": {"deploy-token": "t0k3n"}},
        "spec": {
            "configPatches": [
                {
                    "applyTo": "CLUSTER",
                    "patch": {
                        "operation": "ADD",
                        "value": {
                            "name": "inline-key",
                            "type": "STATIC",
                            "transport_socket": {
                                "name": "envoy.transport_sockets.tls",
                                "typed_config": {
                                    "@type": UPSTREAM_TLS,
                                    "common_tls_context": {
                                        "tls_certificates": [{"private_key": {"inline_string": KEY}}]
                                    },
                                },
                            },
                        },
                    },
                }
            ]
        },
    }
    write(config / "filter.yaml", [filter_])
    async with running(settings_for(config)) as app, aiohttp.ClientSession() as session:
        proxy = await _connect(app, "productpage-v1", "default")
        try:
            for address in (app.settings.http_addr, app.settings.monitoring_addr):
                async with session.get(f"http://{address}/debug/configz") as response:
                    assert response.status == 200
                    text = await response.text()
                assert "EnvoyFilter" in text and "PRIVATE KEY" not in text and "t0k3n" not in text
                # The config dump hides its secrets itself (xds.config_dump), for HTTP as for xDS.
                path = "/debug/config_dump?proxyID=productpage-v1.default"
                async with session.get(f"http://{address}{path}") as response:
                    assert response.status == 200
                    text = await response.text()
                assert "inline-key" in text and "PRIVATE KEY" not in text and REDACTED in text
        finally:
            await proxy.close()


async def _connect(app: DiscoveryApp, pod: str, namespace: str) -> AdsClient:
    """A sidecar of ``namespace`` connected (over plaintext) and holding its clusters."""
    client = AdsClient(str(app.settings.grpc_addr))
    client.send(
        CDS,
        node_id=f"sidecar~127.0.0.12~{pod}.{namespace}~{namespace}.svc.cluster.local",
        node_metadata={"PROXY_CONFIG": {}, "NAMESPACE": namespace},
    )
    client.ack(await client.recv())
    return client


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[DiscoveryApp]:
    config = tmp_path / "config"
    reviews = workload("reviews", "default", "10.96.0.20", 9080, {"reviews-v1": "127.0.0.21"})
    write(config / "apps.yaml", reviews)
    async with running(settings_for(config)) as served:
        yield served


async def test_a_proxy_id_that_is_part_of_another_namespaces_proxy_finds_nothing(app: DiscoveryApp) -> None:
    """A token of namespace ``bar`` asking for ``reviews-1.bar`` must not get the dump of
    ``reviews-1.bar-prod-7``: the page matches a part of the proxy ID, but only within the scope."""
    [page] = [r for r in app.debug.routes() if r.path == "/debug/config_dump"]
    guard = _guard(app.debug_rule)

    async def read(proxy_id: str, token: str) -> tuple[int, str]:
        request = _request(f"/debug/config_dump?proxyID={proxy_id}", "10.0.0.9", token)
        response = await guard(request, page.handler)
        assert isinstance(response, web.Response)
        return response.status, response.text or ""

    proxy = await _connect(app, "reviews-1", "bar-prod-7")
    try:
        for proxy_id in ("reviews-1.bar", "reviews-1.bar-prod-7", "reviews-1"):
            status, text = await read(proxy_id, "bar")
            assert status == 404 and "not connected" in text
        for token in ("barprod", "admin"):
            status, text = await read("reviews-1.bar", token)
            assert status == 200 and "ClustersConfigDump" in text
        # Outside its namespace a caller may read nothing else.
        assert (await read("reviews-1.bar", "app"))[0] == 404
        # A page that no access middleware let through is not served.
        response = await page.handler(_request("/debug/config_dump?proxyID=reviews-1", "127.0.0.1"))
        assert response.status == 403
    finally:
        await proxy.close()
