"""Secrets from the API server: watched as istiod watches them (no Helm releases, no service-account
tokens), decoded as the config directory decodes them, and handed to the credentials SDS serves."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.kube_api import KubeApiServer

from kube.test_source import Cluster, until
from meshpilot.kube.source import SECRETS_FIELD_SELECTOR, resource_of
from meshpilot.model.kind import Kind

pytestmark = pytest.mark.integration


@pytest.fixture
def api() -> Iterator[KubeApiServer]:
    with KubeApiServer() as server:
        yield server


@pytest.fixture
async def cluster(api: KubeApiServer, tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(api, tmp_path)
    yield c
    c.source.stop()
    c.client.close()


def _secret(name: str, type_: str, data: dict[str, bytes]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": "gw"},
        "type": type_,
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }


def test_the_secret_informer_leaves_out_helm_releases_and_tokens() -> None:
    assert resource_of(Kind.SECRET).field_selector == SECRETS_FIELD_SELECTOR
    assert "type!=helm.sh/release.v1" in SECRETS_FIELD_SELECTOR
    assert "type!=kubernetes.io/service-account-token" in SECRETS_FIELD_SELECTOR


async def test_tls_secrets_reach_the_credentials_and_follow_changes(
    api: KubeApiServer, cluster: Cluster
) -> None:
    secrets = cluster.source._sink.secrets  # type: ignore[attr-defined]
    api.apply(_secret("tls", "kubernetes.io/tls", {"tls.crt": b"CERT", "tls.key": b"KEY"}))
    api.apply(_secret("helm", "helm.sh/release.v1", {"release": b"x"}))
    api.apply(_secret("token", "kubernetes.io/service-account-token", {"token": b"x"}))
    cluster.source.start()
    await asyncio.wait_for(cluster.source.wait_synced(), 10)
    assert secrets.get("gw", "tls").data == {"tls.crt": b"CERT", "tls.key": b"KEY"}
    assert secrets.get("gw", "helm") is None
    assert secrets.get("gw", "token") is None
    api.apply(_secret("tls", "kubernetes.io/tls", {"tls.crt": b"NEW", "tls.key": b"KEY"}))
    await until(lambda: secrets.get("gw", "tls").data["tls.crt"] == b"NEW", what="the rotated Secret")
    api.delete("secrets", "gw", "tls")
    await until(lambda: secrets.get("gw", "tls") is None, what="the deleted Secret")
