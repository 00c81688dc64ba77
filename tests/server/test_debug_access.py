"""The debug pages as istiod scopes them: loopback callers read everything; others need a token the
xDS authenticators accept, and outside the system namespace see only their own proxies' config
dumps; pushes only from loopback; secrets and extra node metadata never shown."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from support.kube import write
from support.xds_server import running, settings_for

from meshpilot.ca.authenticate import Authenticator, Caller
from meshpilot.server.debug_access import debug_access
from meshpilot.server.redaction import REDACTED, adsz_metadata, redact

UPSTREAM_TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
KEY = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\n"


class _Tokens:
    """An authenticator that knows two tokens."""

    async def authenticate(
        self, auth: dict[str, list[bytes]], metadata: Sequence[tuple[str, Any]]
    ) -> Caller | None:
        tokens = {
            "Bearer admin": "spiffe://cluster.local/ns/istio-system/sa/istiod",
            "Bearer app": "spiffe://cluster.local/ns/shop/sa/app",
        }
        for key, value in metadata:
            if key == "authorization" and value in tokens:
                return Caller((tokens[value],), "test token")
        return None


async def _status(path: str, remote: str, token: str = "") -> int:
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: (
        (remote, 4321) if name == "peername" else default
    )
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = make_mocked_request("GET", path, headers=headers, transport=transport)
    authenticators: tuple[Authenticator, ...] = (_Tokens(),)
    guard = debug_access(lambda: authenticators, "istio-system")

    async def handler(request: web.Request) -> web.Response:
        return web.Response(text="page")

    response = await guard(request, handler)
    return response.status


@pytest.mark.parametrize(
    ("path", "remote", "token", "status"),
    [
        ("/debug/configz", "127.0.0.1", "", 200),
        ("/debug/adsz?push=true", "::1", "", 200),
        ("/debug/configz", "10.0.0.9", "", 401),
        ("/debug/configz", "10.0.0.9", "forged", 401),
        ("/debug/configz", "10.0.0.9", "admin", 200),
        ("/debug/adsz?push=true", "10.0.0.9", "admin", 403),
        ("/debug/configz", "10.0.0.9", "app", 403),
        ("/debug/syncz", "10.0.0.9", "app", 403),
        ("/debug/config_dump?proxyID=productpage-v1.default", "10.0.0.9", "app", 403),
        ("/debug/config_dump?proxyID=cart-v1.shop", "10.0.0.9", "app", 200),
        ("/ready", "10.0.0.9", "", 200),
        ("/metrics", "10.0.0.9", "", 200),
    ],
)
async def test_who_may_read_which_page(path: str, remote: str, token: str, status: int) -> None:
    assert await _status(path, remote, token) == status


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
        for address in (app.settings.http_addr, app.settings.monitoring_addr):
            async with session.get(f"http://{address}/debug/configz") as response:
                assert response.status == 200
                text = await response.text()
            assert "EnvoyFilter" in text and "PRIVATE KEY" not in text and "t0k3n" not in text
