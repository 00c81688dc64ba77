"""The SDS generator: istiod's authorization and key rules, on ADS."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from support.model import build
from support.tls_backend import self_signed

from meshpilot.config.core_objects import KubeSecret, ObjectMeta
from meshpilot.kube.secret_access import KubeSecretAccess, NamespaceAccess
from meshpilot.model.config import ConfigKey
from meshpilot.model.credentials import CredentialStore
from meshpilot.model.kind import Kind
from meshpilot.model.push_request import PushRequest
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.dependencies import proxy_needs_push
from meshpilot.xds.generators import GenerationContext, SecretGenerator
from meshpilot.xds.types import TypeUrl

GW_ID = "router~10.1.0.100~gw-1.gw~gw.svc.cluster.local"
GW_IDENTITY = "spiffe://cluster.local/ns/gw/sa/gateway"


class _Access:
    def __init__(self, answer: str | None) -> None:
        self.answer = answer
        self.asked: list[tuple[str, str]] = []

    def check(self, service_account: str, namespace: str) -> str | None:
        self.asked.append((service_account, namespace))
        return self.answer


@pytest.fixture
def pem(tmp_path: Path) -> tuple[bytes, bytes]:
    cert, key = self_signed(["gw.example.com"], tmp_path)
    return cert.read_bytes(), key.read_bytes()


def _store(pem: tuple[bytes, bytes]) -> CredentialStore:
    store = CredentialStore()
    data = {"tls.crt": pem[0], "tls.key": pem[1], "ca.crt": pem[0]}
    store.upsert(KubeSecret(ObjectMeta("tls", "gw"), "kubernetes.io/tls", data))
    store.upsert(KubeSecret(ObjectMeta("tls", "other"), "kubernetes.io/tls", data))
    store.upsert(KubeSecret(ObjectMeta("nokeys", "gw"), "Opaque", {"foo": b"bar"}))
    return store


def _generate(gen: SecretGenerator, names: set[str], identity: str = GW_IDENTITY) -> dict[str, object]:
    model = build([])
    proxy = model.proxy(GW_ID)
    request = PushRequest(full=True, forced=True, reasons=Counter(), push=model.push)
    ctx = GenerationContext(proxy, model.push, model.index, request, identity=identity)
    watch = WatchedResource(TypeUrl.SECRET.value, frozenset(names))
    out = gen.generate(ctx, watch, None)
    if out is None:
        return {}
    result: dict[str, object] = {}
    for r in out:
        secret = secret_pb2.Secret()
        r.message().Unpack(secret)
        result[r.name] = secret
    return result


def test_an_authorized_proxy_gets_key_and_ca_of_its_own_namespace(pem: tuple[bytes, bytes]) -> None:
    errors: list[int] = []
    gen = SecretGenerator(_store(pem), _Access(""), lambda: errors.append(1))
    got = _generate(gen, {"kubernetes://tls", "kubernetes://tls-cacert", "kubernetes://gw/tls"})
    assert sorted(got) == ["kubernetes://gw/tls", "kubernetes://tls", "kubernetes://tls-cacert"]
    cert = got["kubernetes://tls"]
    assert isinstance(cert, secret_pb2.Secret)
    assert cert.tls_certificate.certificate_chain.inline_bytes == pem[0]
    assert cert.tls_certificate.private_key.inline_bytes == pem[1]
    ca = got["kubernetes://tls-cacert"]
    assert isinstance(ca, secret_pb2.Secret)
    assert ca.validation_context.trusted_ca.inline_bytes == pem[0]
    assert errors == []


def test_plaintext_streams_get_nothing(pem: tuple[bytes, bytes], caplog: pytest.LogCaptureFixture) -> None:
    gen = SecretGenerator(_store(pem), _Access(""), lambda: None)
    with caplog.at_level(logging.WARNING):
        assert _generate(gen, {"kubernetes://tls"}, identity="") == {}
    assert "not authorized to receive credentials" in caplog.text


def test_another_namespace_is_denied_logged_and_counted(
    pem: tuple[bytes, bytes], caplog: pytest.LogCaptureFixture
) -> None:
    errors: list[int] = []
    gen = SecretGenerator(_store(pem), _Access(""), lambda: errors.append(1))
    with caplog.at_level(logging.WARNING):
        got = _generate(gen, {"kubernetes://other/tls", "kubernetes://other/tls-cacert", "kubernetes://tls"})
    assert sorted(got) == ["kubernetes://tls"]
    assert errors == [1]
    assert "attempted to access unauthorized certificates tls, tls-cacert" in caplog.text


def test_without_access_to_secrets_only_the_ca_is_served(pem: tuple[bytes, bytes]) -> None:
    errors: list[int] = []
    access = _Access("gateway/gw is not authorized to read secrets: no RBAC")
    gen = SecretGenerator(_store(pem), access, lambda: errors.append(1))
    got = _generate(gen, {"kubernetes://tls", "kubernetes://tls-cacert"})
    assert sorted(got) == ["kubernetes://tls-cacert"]
    assert errors == [1]
    assert access.asked == [("gateway", "gw")]
    # Not reviewed yet: nothing private either, and nothing counted.
    pending = SecretGenerator(_store(pem), _Access(None), lambda: errors.append(1))
    assert sorted(_generate(pending, {"kubernetes://tls", "kubernetes://tls-cacert"})) == [
        "kubernetes://tls-cacert"
    ]
    assert errors == [1]


def test_secrets_without_keys_and_unknown_types_are_counted(pem: tuple[bytes, bytes]) -> None:
    errors: list[int] = []
    gen = SecretGenerator(_store(pem), NamespaceAccess(), lambda: errors.append(1))
    got = _generate(gen, {"kubernetes://nokeys", "kubernetes://missing", "configmap://gw/ca"})
    assert got == {}
    assert len(errors) == 3


def test_a_secret_change_concerns_sds_only(pem: tuple[bytes, bytes]) -> None:
    gen = SecretGenerator(_store(pem), NamespaceAccess(), lambda: None)
    change = PushRequest(full=False, configs_updated=frozenset({ConfigKey(Kind.SECRET, "tls", "gw")}))
    assert gen.needs_push(change)
    assert not gen.needs_push(
        PushRequest(full=True, configs_updated=frozenset({ConfigKey(Kind.GATEWAY, "g")}))
    )
    from meshpilot.xds.generators import sidecar_generators

    others = sidecar_generators()
    assert not any(g.needs_push(change) for g in others.values())
    proxy = build([]).proxy(GW_ID)
    assert proxy_needs_push(proxy, change, "istio-system")


def test_reviews_are_cached_and_run_off_the_loop() -> None:
    calls: list[tuple[str, str]] = []
    changed: list[str] = []
    now = [0.0]

    def review(sa: str, ns: str) -> str:
        calls.append((sa, ns))
        return "" if sa == "gateway" else "denied"

    async def until(done: Callable[[], bool]) -> None:
        # A review runs on a worker thread (the first one starts it): polled, not a fixed sleep.
        for _ in range(500):
            if done():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the review was not answered within 5 s")

    async def scenario() -> None:
        access = KubeSecretAccess(review, changed.append, clock=lambda: now[0])
        assert access.check("gateway", "gw") is None
        assert access.check("gateway", "gw") is None  # one review in flight
        await until(lambda: access.check("gateway", "gw") is not None)
        assert access.check("gateway", "gw") == ""
        assert access.check("other", "gw") is None
        await until(lambda: access.check("other", "gw") is not None)
        assert access.check("other", "gw") == "denied"
        assert calls == [("gateway", "gw"), ("other", "gw")]
        now[0] = 61.0  # the deny expired, the allow not
        assert access.check("other", "gw") == "denied"
        assert access.check("gateway", "gw") == ""
        await until(lambda: len(calls) >= 3)
        await asyncio.sleep(0.05)  # no fourth review follows
        assert calls[-1] == ("other", "gw") and len(calls) == 3
        await access.shutdown()

    asyncio.run(scenario())
    assert changed == ["gw", "gw"]
