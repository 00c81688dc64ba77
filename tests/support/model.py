"""An in-process mesh model built from objects, for builder and generator tests."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from meshpilot.config.decode import decode_object
from meshpilot.config.store import ConfigStore
from meshpilot.model.config import Config
from meshpilot.model.endpoint_index import EndpointIndex
from meshpilot.model.mesh import apply_mesh_config, default_mesh_config
from meshpilot.model.proxy import NodeMetadata, Proxy, parse_proxy
from meshpilot.model.push_context import PushContext
from meshpilot.push.environment import MeshEnvironment
from meshpilot.registry.aggregate import AggregateRegistry
from meshpilot.registry.kube.controller import KubeRegistry
from meshpilot.registry.serviceentry.controller import ServiceEntryRegistry


class _IndexUpdater:
    """Applies registry reports straight to the index, as the server does, without pushing."""

    def __init__(self, index: EndpointIndex) -> None:
        self.index = index

    def config_update(self, request: Any) -> None:
        pass

    def eds_update(self, shard: Any, hostname: str, namespace: str, endpoints: Any) -> None:
        self.index.update_service_endpoints(shard, hostname, namespace, endpoints)

    def service_update(self, shard: Any, hostname: str, namespace: str, deleted: bool) -> None:
        if deleted:
            self.index.delete_service_shard(shard, hostname, namespace)

    def proxy_update(self, cluster_id: str, ip: str) -> None:
        pass


@dataclass
class Model:
    env: MeshEnvironment
    push: PushContext

    @property
    def index(self) -> EndpointIndex:
        return self.env.index

    def proxy(
        self, node_id: str, metadata: Mapping[str, Any] | None = None, extensions: Iterable[str] = ()
    ) -> Proxy:
        meta = {
            "NAMESPACE": node_id.split("~")[3].split(".")[0],
            "ISTIO_VERSION": "1.28.0",
            **(metadata or {}),
        }
        proxy = parse_proxy(node_id, NodeMetadata.parse(meta), extensions=frozenset(extensions))
        self.env.refresh_proxy(proxy, self.push)
        return proxy

    def upsert(self, doc: Mapping[str, Any]) -> None:
        """Add or replace an object: a config in the store, a Kubernetes object in its registry
        (seen by the next snapshot)."""
        _upsert(self.env.store, _kube(self.env), doc)


def build(docs: Iterable[Mapping[str, Any]], mesh_yaml: str | None = None) -> Model:
    store = ConfigStore()
    index = EndpointIndex()
    updater = _IndexUpdater(index)
    kube = KubeRegistry(updater)
    entries = ServiceEntryRegistry(store, updater, pods=kube)
    mesh = apply_mesh_config(mesh_yaml) if mesh_yaml else default_mesh_config()
    env = MeshEnvironment(store=store, registry=AggregateRegistry([kube], [entries]), index=index, mesh=mesh)
    for doc in docs:
        _upsert(store, kube, doc)
    return Model(env, env.build_push_context("test/1"))


def _upsert(store: ConfigStore, kube: KubeRegistry, doc: Mapping[str, Any]) -> None:
    obj = decode_object(dict(doc)).obj
    if isinstance(obj, Config):
        store.upsert(obj)
    else:
        kube.upsert(obj)


def _kube(env: MeshEnvironment) -> KubeRegistry:
    kube = env.registry.workloads[0]
    assert isinstance(kube, KubeRegistry)
    return kube
