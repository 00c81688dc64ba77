"""``caBundle`` of istiod's webhook configurations kept (``meshpilot.kube.webhook_ca``), against a
real kube-apiserver (``make reference``)."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

import pytest
from support.real_kube import RealKubeApiServer

from meshpilot.kube.webhook_ca import WebhookCaPatcher, WebhookKind, patched

pytestmark = [pytest.mark.reference, pytest.mark.timeout(180)]

T = TypeVar("T")
BUNDLE = "-----BEGIN CERTIFICATE-----\nmesh root\n-----END CERTIFICATE-----\n"
NEW_BUNDLE = "-----BEGIN CERTIFICATE-----\nnew mesh root\n-----END CERTIFICATE-----\n"
MUTATING = "mutatingwebhookconfigurations.admissionregistration.k8s.io"
VALIDATING = "validatingwebhookconfigurations.admissionregistration.k8s.io"


def b64(pem: str) -> str:
    return base64.b64encode(pem.encode()).decode()


def webhook(name: str, ca_bundle: str = "") -> dict[str, Any]:
    """A webhook that never applies (its namespace selector matches nothing) and is ignored if down."""
    client_config: dict[str, Any] = {"url": "https://127.0.0.1:1/hook"}
    if ca_bundle:
        client_config["caBundle"] = ca_bundle
    return {
        "name": name,
        "clientConfig": client_config,
        "sideEffects": "None",
        "failurePolicy": "Ignore",
        "admissionReviewVersions": ["v1"],
        "rules": [
            {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}
        ],
        "namespaceSelector": {"matchLabels": {"never": "matches"}},
    }


def configuration(
    kind: WebhookKind, name: str, revision: str | None, *webhooks: dict[str, Any]
) -> dict[str, Any]:
    labels = {"istio.io/rev": revision} if revision is not None else {}
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind.kind,
        "metadata": {"name": name, "labels": labels},
        "webhooks": list(webhooks),
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealKubeApiServer]:
    with RealKubeApiServer(tmp_path_factory.mktemp("kube")) as started:
        yield started


@pytest.fixture
def kube(server: RealKubeApiServer) -> RealKubeApiServer:
    server.reset()
    # The charts' configurations for the default revision, and two istiod leaves alone.
    m, v = WebhookKind.MUTATING, WebhookKind.VALIDATING
    server.apply(
        configuration(
            m,
            "istio-sidecar-injector",
            "default",
            webhook("rev.namespace.sidecar-injector.istio.io"),
            webhook("someone.else.example.com", b64("theirs")),
        )
    )
    server.apply(
        configuration(v, "istio-validator-istio-system", "default", webhook("rev.validation.istio.io"))
    )
    server.apply(
        configuration(m, "canary-injector", "canary", webhook("namespace.sidecar-injector.istio.io"))
    )
    server.apply(configuration(m, "unlabelled", None, webhook("namespace.sidecar-injector.istio.io")))
    return server


@pytest.fixture
async def patcher(kube: RealKubeApiServer) -> AsyncIterator[WebhookCaPatcher]:
    with kube.api_client() as api:
        started = WebhookCaPatcher(api, BUNDLE)
        started.start()
        try:
            await asyncio.wait_for(started.wait_synced(), 30)
            yield started
        finally:
            await started.stop()
        assert not any(i._thread is not None and i._thread.is_alive() for i in started._informers)


async def eventually(check: Callable[[], T], timeout: float = 15.0, what: str = "") -> T:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}: last {last!r}")


def bundles(kube: RealKubeApiServer, resource: str, name: str) -> dict[str, str]:
    stored = kube.get(resource, "", name)
    assert stored is not None
    return {w["name"]: w["clientConfig"].get("caBundle", "") for w in stored["webhooks"]}


def injector(kube: RealKubeApiServer) -> dict[str, str]:
    return bundles(kube, MUTATING, "istio-sidecar-injector")


def validator(kube: RealKubeApiServer) -> dict[str, str]:
    return bundles(kube, VALIDATING, "istio-validator-istio-system")


async def test_istiods_webhooks_get_the_bundle_and_no_others(
    kube: RealKubeApiServer, patcher: WebhookCaPatcher
) -> None:
    await eventually(
        lambda: injector(kube)["rev.namespace.sidecar-injector.istio.io"] == b64(BUNDLE), what="the injector"
    )
    await eventually(
        lambda: validator(kube) == {"rev.validation.istio.io": b64(BUNDLE)}, what="the validator"
    )
    assert injector(kube)["someone.else.example.com"] == b64("theirs")
    assert bundles(kube, MUTATING, "canary-injector") == {"namespace.sidecar-injector.istio.io": ""}
    assert bundles(kube, MUTATING, "unlabelled") == {"namespace.sidecar-injector.istio.io": ""}
    await eventually(lambda: patcher.writes == 2, what="two writes counted")


async def test_an_edited_bundle_is_patched_back_and_a_new_bundle_followed(
    kube: RealKubeApiServer, patcher: WebhookCaPatcher
) -> None:
    await eventually(
        lambda: validator(kube) == {"rev.validation.istio.io": b64(BUNDLE)}, what="the validator"
    )
    await eventually(lambda: patcher.writes == 2, what="both patched")
    stored = kube.get(VALIDATING, "", "istio-validator-istio-system")
    assert stored is not None
    stored["webhooks"][0]["clientConfig"]["caBundle"] = b64("tampered")
    kube.apply(stored)
    await eventually(lambda: validator(kube) == {"rev.validation.istio.io": b64(BUNDLE)}, what="patched back")
    await eventually(lambda: patcher.writes == 3, what="the third write counted")
    patcher.set_ca_bundle(NEW_BUNDLE)
    await eventually(
        lambda: injector(kube)["rev.namespace.sidecar-injector.istio.io"] == b64(NEW_BUNDLE),
        what="the new bundle",
    )
    await eventually(
        lambda: validator(kube) == {"rev.validation.istio.io": b64(NEW_BUNDLE)}, what="the new bundle"
    )
    # A configuration labelled for the revision later is patched as it appears.
    kube.apply(
        configuration(
            WebhookKind.VALIDATING, "istiod-default-validator", "default", webhook("validation.istio.io")
        )
    )
    await eventually(
        lambda: (
            bundles(kube, VALIDATING, "istiod-default-validator") == {"validation.istio.io": b64(NEW_BUNDLE)}
        ),
        what="the default validator",
    )


def test_only_istiods_webhooks_change_and_only_when_they_differ() -> None:
    config = configuration(
        WebhookKind.MUTATING, "x", "default", webhook("a.sidecar-injector.istio.io"), webhook("b.example.com")
    )
    update = patched(WebhookKind.MUTATING, config, "QQ==")
    assert update is not None and [w["clientConfig"].get("caBundle") for w in update["webhooks"]] == [
        "QQ==",
        None,
    ]
    assert config["webhooks"][0]["clientConfig"].get("caBundle") is None  # the seen object is not changed
    assert patched(WebhookKind.MUTATING, update, "QQ==") is None
    assert patched(WebhookKind.VALIDATING, config, "QQ==") is not None
    assert (
        patched(
            WebhookKind.MUTATING, configuration(WebhookKind.MUTATING, "y", "default", webhook("c")), "QQ=="
        )
        is None
    )
