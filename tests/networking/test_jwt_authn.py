"""RequestAuthentication as jwt_authn, before RBAC; JWKS fetched by the resolver, failing closed."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web
from envoy.extensions.filters.http.jwt_authn.v3 import config_pb2 as jwt_pb2
from google.protobuf import json_format
from support.kube import istio
from support.mesh_objects import mesh_objects
from support.model import build

from meshpilot.model.config import ConfigKey
from meshpilot.model.kind import Kind
from meshpilot.networking.jwt_authn import PUBLIC_ONLY_JWKS
from meshpilot.networking.policy_problems import PolicyProblems
from meshpilot.push.jwks_resolver import JwksOptions, JwksResolver

from .test_rbac import http_filters, virtual_inbound

JWKS = json.dumps({"keys": [{"kty": "RSA", "e": "AQAB", "n": "abc", "kid": "k"}]})


def request_authentication(name: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return istio("RequestAuthentication", name, "default", {"jwtRules": rules}, group="security")


def jwt_config(filters: list[Any]) -> Any:
    f = next(f for f in filters if f.name == "envoy.filters.http.jwt_authn")
    out = jwt_pb2.JwtAuthentication()
    f.typed_config.Unpack(out)
    return json_format.MessageToDict(out)


def test_jwt_filter_before_rbac_with_istiod_providers() -> None:
    docs = [
        request_authentication(
            "jwt",
            [
                {
                    "issuer": "https://b.example",
                    "jwks": JWKS,
                    "fromHeaders": [{"name": "x-jwt", "prefix": "Bearer "}],
                    "fromParams": ["token"],
                    "outputPayloadToHeader": "x-payload",
                    "forwardOriginalToken": True,
                },
                {"issuer": "https://a.example", "jwksUri": "http://127.0.0.1:1/jwks"},
            ],
        ),
        istio(
            "AuthorizationPolicy",
            "require",
            "default",
            {"rules": [{"from": [{"source": {"requestPrincipals": ["*"]}}]}]},
            group="security",
        ),
    ]
    filters = http_filters(virtual_inbound(build([*mesh_objects(), *docs])), 9080)
    names = [f.name for f in filters]
    assert names.index("envoy.filters.http.jwt_authn") == names.index("envoy.filters.http.rbac") - 1
    config = jwt_config(filters)
    a, b = config["providers"]["origins-0"], config["providers"]["origins-1"]
    assert a["issuer"] == "https://a.example"
    # Nothing fetched: the key nobody can sign for (fail closed), as istiod.
    assert a["localJwks"]["inlineString"] == PUBLIC_ONLY_JWKS
    assert b["localJwks"]["inlineString"] == JWKS
    assert b["fromHeaders"] == [{"name": "x-jwt", "valuePrefix": "Bearer "}]
    assert b["fromParams"] == ["token"]
    assert b["forwardPayloadHeader"] == "x-payload"
    assert b["forward"] is True
    assert b["payloadInMetadata"] == "payload"
    assert b["normalizePayloadInMetadata"] == {"spaceDelimitedClaims": ["permission", "scope"]}
    # Only gateways re-pick their route after the filter (the golden case gateway-authz has it set).
    assert "clearRouteCache" not in a and "clearRouteCache" not in b
    assert config["bypassCorsPreflight"] is True
    requires = config["rules"][0]["requires"]["requiresAny"]["requirements"]
    assert requires[:2] == [{"providerName": "origins-0"}, {"providerName": "origins-1"}]
    assert requires[2]["requiresAll"]["requirements"][0] == {
        "requiresAny": {"requirements": [{"providerName": "origins-0"}, {"allowMissing": {}}]}
    }


async def test_resolver_fetches_keeps_last_good_and_counts_failures() -> None:
    state = {"status": 200, "body": JWKS}

    async def handler(request: web.Request) -> web.Response:
        if state["status"] == "slow":
            await asyncio.sleep(2)
        return web.Response(
            status=int(state["status"]) if state["status"] != "slow" else 200, text=str(state["body"])
        )

    app = web.Application()
    app.router.add_get("/jwks", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    uri = f"http://127.0.0.1:{port}/jwks"
    changed: list[frozenset[ConfigKey]] = []
    problems = PolicyProblems()
    resolver = JwksResolver(changed.append, JwksOptions(refresh_s=0.1, retry_s=0.1), problems=problems)
    owner = ConfigKey(Kind.REQUEST_AUTHENTICATION, "jwt", "default")
    task = asyncio.create_task(resolver.run())
    try:
        assert resolver.jwks(uri, "iss", 0.5, owner) is None
        for _ in range(100):
            if changed:
                break
            await asyncio.sleep(0.02)
        assert changed == [frozenset({owner})]
        assert resolver.jwks(uri, "iss", 0.5, owner) == JWKS
        for bad in (
            {"status": 500, "body": "no"},
            {"status": 200, "body": "not json"},
            {"status": 200, "body": '{"keys": []}'},
            {"status": "slow", "body": JWKS},
        ):
            state.update(bad)
            before = problems.count("RequestAuthentication", "default/jwt")
            for _ in range(200):
                if problems.count("RequestAuthentication", "default/jwt") > before:
                    break
                await asyncio.sleep(0.02)
            assert problems.count("RequestAuthentication", "default/jwt") > before, bad
            # The last good keys stay.
            assert resolver.jwks(uri, "iss", 0.5, owner) == JWKS
        assert len(changed) == 1
    finally:
        await resolver.shutdown()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await runner.cleanup()
