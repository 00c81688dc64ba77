"""Remote clusters from Secrets labelled ``istio/multiCluster=true`` in the istio namespace.

As istiod's secret controller: each data key of such a Secret is a cluster
ID and its value a kubeconfig. Each remote cluster gets its own Kubernetes
registry, whose endpoints are their own shard of the EndpointIndex (the
shard is named by the cluster ID), fed by its own informers of the registry
kinds. Istio config is read from the local (config) cluster only.

A key equal to the local cluster ID is ignored; a cluster ID already added
by another Secret is reported and ignored; a changed kubeconfig restarts
that cluster; a removed key or Secret removes the cluster's services and
endpoints and pushes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from kubernetes import client as kclient

from meshpilot.config.decode import Decoded
from meshpilot.config.errors import ConfigError
from meshpilot.config.file_source import ObjectSink
from meshpilot.kube.client import KubeError, client_from_kubeconfig_text
from meshpilot.kube.informer import Change
from meshpilot.kube.metrics import KubeMetrics
from meshpilot.kube.namespaces import NamespaceFilter
from meshpilot.kube.source import REGISTRY_KINDS, KubeSource
from meshpilot.model.config import Config
from meshpilot.model.kind import Kind
from meshpilot.registry.kube.controller import KubeRegistry

log = logging.getLogger(__name__)

MULTICLUSTER_LABEL = "istio/multiCluster"

SecretName = tuple[str, str]


@dataclass(frozen=True, slots=True)
class ClusterSecret:
    """A decoded multicluster Secret: cluster ID to kubeconfig text."""

    kubeconfigs: dict[str, str]


def decode_secret(raw: dict[str, Any]) -> ClusterSecret:
    data = raw.get("data") or {}
    if not isinstance(data, dict):
        raise ConfigError("data is not a mapping")
    out: dict[str, str] = {}
    for cluster_id, value in data.items():
        try:
            out[str(cluster_id)] = base64.b64decode(str(value), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError) as err:
            raise ConfigError(f"data.{cluster_id} is not a base64 kubeconfig: {err}") from None
    return ClusterSecret(out)


@dataclass(slots=True)
class RemoteCluster:
    cluster_id: str
    secret: SecretName
    digest: str
    api: kclient.ApiClient
    registry: KubeRegistry
    source: KubeSource


class RemoteClusters:
    """Adds and removes remote clusters as their Secrets change."""

    def __init__(
        self,
        local_cluster: str,
        make_registry: Callable[[str], KubeRegistry],
        attach: Callable[[KubeRegistry], None],
        detach: Callable[[KubeRegistry], None],
        *,
        metrics: KubeMetrics | None = None,
        selectors: Callable[[], list[dict[str, Any]]] = list,
        watch_timeout: tuple[int, int] | None = None,
        sink: Callable[[KubeRegistry], ObjectSink] | None = None,
    ) -> None:
        """``sink``: what a remote cluster's source writes to, given its registry (the registry
        itself by default; the main process of a push-worker pool also records the changes)."""
        self._local = local_cluster
        self._sink = sink or registry_sink
        self._make_registry = make_registry
        self._attach = attach
        self._detach = detach
        self._metrics = metrics
        self._selectors = selectors
        self._watch_timeout = watch_timeout
        self.clusters: dict[str, RemoteCluster] = {}
        self._secrets: dict[SecretName, ClusterSecret] = {}

    def apply(self, changes: list[Change[ClusterSecret]]) -> None:
        for change in changes:
            if change.deleted:
                self._secrets.pop(change.name, None)
            elif change.obj is not None:
                self._secrets[change.name] = change.obj
            else:
                log.error("multicluster secret %s/%s rejected: %s", *change.name, change.error)
        self._reconcile()

    def set_discovery_selectors(self, selectors: list[dict[str, Any]]) -> None:
        for cluster in self.clusters.values():
            cluster.source.set_discovery_selectors(selectors)

    def stop(self) -> None:
        for cluster_id in list(self.clusters):
            self._remove(cluster_id)

    def _reconcile(self) -> None:
        wanted: dict[str, tuple[SecretName, str]] = {}
        for name in sorted(self._secrets):
            for cluster_id, kubeconfig in sorted(self._secrets[name].kubeconfigs.items()):
                if cluster_id == self._local:
                    log.info(
                        "multicluster secret %s/%s: key %s is the local cluster; ignored", *name, cluster_id
                    )
                elif cluster_id in wanted:
                    other = wanted[cluster_id][0]
                    log.error(
                        "multicluster secret %s/%s: cluster %s is already defined by %s/%s; ignored",
                        *name,
                        cluster_id,
                        *other,
                    )
                else:
                    wanted[cluster_id] = (name, kubeconfig)
        for cluster_id in list(self.clusters):
            current = self.clusters[cluster_id]
            want = wanted.get(cluster_id)
            if want is None or _digest(want[1]) != current.digest:
                self._remove(cluster_id)
        for cluster_id, (secret, kubeconfig) in wanted.items():
            if cluster_id not in self.clusters:
                self._add(cluster_id, secret, kubeconfig)

    def _add(self, cluster_id: str, secret: SecretName, kubeconfig: str) -> None:
        try:
            api = client_from_kubeconfig_text(kubeconfig)
        except KubeError as err:
            log.error("multicluster secret %s/%s: cluster %s: %s", *secret, cluster_id, err)
            return
        registry = self._make_registry(cluster_id)
        source = KubeSource(
            api,
            self._sink(registry),
            kinds=REGISTRY_KINDS,
            cluster=cluster_id,
            metrics=self._metrics,
            namespaces=NamespaceFilter(self._selectors()),
            watch_timeout=self._watch_timeout,
        )
        self._attach(registry)
        source.start()
        self.clusters[cluster_id] = RemoteCluster(
            cluster_id, secret, _digest(kubeconfig), api, registry, source
        )
        log.info("multicluster: added cluster %s from secret %s/%s", cluster_id, *secret)

    def _remove(self, cluster_id: str) -> None:
        cluster = self.clusters.pop(cluster_id)
        cluster.source.stop()
        cluster.source.remove_all()
        self._detach(cluster.registry)
        cluster.api.close()  # type: ignore[no-untyped-call]
        log.info("multicluster: removed cluster %s", cluster_id)


def registry_sink(registry: KubeRegistry) -> ObjectSink:
    return _RegistrySink(registry)


class _RegistrySink:
    """A remote cluster's registry as a sink (remote sources carry no Istio config)."""

    def __init__(self, registry: KubeRegistry) -> None:
        self._registry = registry

    def upsert(self, obj: Decoded) -> None:
        if not isinstance(obj, Config):
            self._registry.upsert(obj)

    def remove(self, kind: Kind, namespace: str, name: str) -> None:
        self._registry.remove(kind, namespace, name)

    def batch(self) -> AbstractContextManager[None]:
        return self._registry.batch()


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
