"""``istio-ca-root-cert`` kept in the selected namespaces (``meshpilot.kube.root_cert``), against a
real kube-apiserver (``make reference``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

import pytest
from prometheus_client import CollectorRegistry
from support.kube import namespace
from support.real_kube import RealKubeApiServer

from meshpilot.kube.root_cert import ROOT_CERT_CONFIGMAP, RootCertPublisher

pytestmark = [pytest.mark.reference, pytest.mark.timeout(180)]

T = TypeVar("T")
ROOT = "-----BEGIN CERTIFICATE-----\nroot one\n-----END CERTIFICATE-----\n"
NEW_ROOT = "-----BEGIN CERTIFICATE-----\nroot two\n-----END CERTIFICATE-----\n"
SELECTED = {"mesh": "on"}
SELECTORS = [{"matchLabels": SELECTED}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealKubeApiServer]:
    with RealKubeApiServer(tmp_path_factory.mktemp("kube")) as started:
        yield started


@pytest.fixture
def kube(server: RealKubeApiServer) -> RealKubeApiServer:
    server.reset()
    return server


@pytest.fixture
async def publisher(kube: RealKubeApiServer) -> AsyncIterator[RootCertPublisher]:
    kube.apply(namespace("app", **SELECTED))
    kube.apply(namespace("other"))
    with kube.api_client() as api:
        started = RootCertPublisher(api, ROOT, selectors=SELECTORS, registry=CollectorRegistry())
        started.start()
        try:
            await asyncio.wait_for(started.wait_synced(), 30)
            yield started
        finally:
            await started.stop()
        assert not any(i._thread is not None and i._thread.is_alive() for i in started._informers)


async def eventually(check: Callable[[], T], timeout: float = 15.0, what: str = "") -> T:
    """``check`` until truthy, the loop running in between (the publisher works on it)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}: last {last!r}")


def root_in(kube: RealKubeApiServer, ns: str) -> str | None:
    configmap = kube.get("configmaps", ns, ROOT_CERT_CONFIGMAP)
    return None if configmap is None else (configmap.get("data") or {}).get("root-cert.pem")


def writes(publisher: RootCertPublisher, operation: str) -> float:
    return float(publisher.metrics.writes.labels(operation=operation)._value.get())


async def test_selected_namespaces_get_the_configmap_with_istiods_label_others_do_not(
    kube: RealKubeApiServer, publisher: RootCertPublisher
) -> None:
    await eventually(lambda: root_in(kube, "app") == ROOT, what="the ConfigMap in app")
    configmap = kube.get("configmaps", "app", ROOT_CERT_CONFIGMAP)
    assert configmap is not None and configmap["metadata"]["labels"] == {"istio.io/config": "true"}
    # A namespace that appears, selected, gets it too; one not selected does not.
    kube.apply(namespace("later", **SELECTED))
    kube.apply(namespace("later-other"))
    await eventually(lambda: root_in(kube, "later") == ROOT, what="the ConfigMap in later")
    await asyncio.sleep(0.5)
    for ns in ("other", "later-other", "default", "kube-system"):
        assert kube.get("configmaps", ns, ROOT_CERT_CONFIGMAP) is None, ns
    await eventually(lambda: writes(publisher, "create") == 2, what="two creates counted")
    assert writes(publisher, "update") == 0


async def test_the_configmap_comes_back_after_a_delete_and_after_an_edit(
    kube: RealKubeApiServer, publisher: RootCertPublisher
) -> None:
    await eventually(lambda: root_in(kube, "app") == ROOT, what="the ConfigMap")
    kube.delete("configmaps", "app", ROOT_CERT_CONFIGMAP)
    await eventually(lambda: root_in(kube, "app") == ROOT, what="the ConfigMap made again")
    edited = kube.get("configmaps", "app", ROOT_CERT_CONFIGMAP)
    assert edited is not None
    edited["data"] = {"root-cert.pem": "tampered", "extra": "kept"}
    kube.apply(edited)
    await eventually(lambda: root_in(kube, "app") == ROOT, what="the key set back")
    restored = kube.get("configmaps", "app", ROOT_CERT_CONFIGMAP)
    assert restored is not None and restored["data"]["extra"] == "kept"  # istiod merges, so do we
    await eventually(lambda: writes(publisher, "update") == 1, what="one update counted")
    assert writes(publisher, "create") == 2


async def test_a_new_root_and_new_selectors_are_followed(
    kube: RealKubeApiServer, publisher: RootCertPublisher
) -> None:
    await eventually(lambda: root_in(kube, "app") == ROOT, what="the ConfigMap")
    publisher.set_root(NEW_ROOT)
    await eventually(lambda: root_in(kube, "app") == NEW_ROOT, what="the new root")
    # A namespace labelled into the selection gets it; with no selectors every namespace does,
    # except Kubernetes' own (kube-system is served, as istiod serves it).
    kube.apply(namespace("other", **SELECTED))
    await eventually(lambda: root_in(kube, "other") == NEW_ROOT, what="the ConfigMap in other")
    publisher.set_discovery_selectors([])
    for ns in ("default", "kube-system"):
        await eventually(lambda ns=ns: root_in(kube, ns) == NEW_ROOT, what=f"the ConfigMap in {ns}")
    for ns in ("kube-public", "kube-node-lease"):
        assert kube.get("configmaps", ns, ROOT_CERT_CONFIGMAP) is None
    # Narrowed again: left alone where it is no longer wanted (istiod removes nothing either).
    publisher.set_discovery_selectors(SELECTORS)
    publisher.set_root(ROOT)
    await eventually(lambda: root_in(kube, "app") == ROOT, what="the first root again")
    await asyncio.sleep(0.5)
    assert root_in(kube, "default") == NEW_ROOT


async def test_stopped_it_writes_nothing(kube: RealKubeApiServer, server: RealKubeApiServer) -> None:
    kube.apply(namespace("app", **SELECTED))
    with kube.api_client() as api:
        publisher = RootCertPublisher(api, ROOT, selectors=SELECTORS)
        publisher.start()
        await eventually(lambda: root_in(kube, "app") == ROOT, what="the ConfigMap")
        await publisher.stop()
        await publisher.stop()  # idempotent
    kube.delete("configmaps", "app", ROOT_CERT_CONFIGMAP)
    await asyncio.sleep(1.0)
    assert kube.get("configmaps", "app", ROOT_CERT_CONFIGMAP) is None
