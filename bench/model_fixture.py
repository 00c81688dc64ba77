"""An in-process model of a benchmark-shaped mesh, for the generator microbenchmarks."""

from __future__ import annotations

from typing import Any

from bench.scenario import Scenario
from meshpilot.config.decode import decode_object
from meshpilot.config.store import ConfigStore
from meshpilot.model.config import Config
from meshpilot.model.endpoint_index import EndpointIndex
from meshpilot.model.mesh import default_mesh_config
from meshpilot.model.proxy import NodeMetadata, Proxy, parse_proxy
from meshpilot.model.push_context import PushContext
from meshpilot.push.environment import MeshEnvironment
from meshpilot.registry.aggregate import AggregateRegistry
from meshpilot.registry.kube.controller import KubeRegistry
from meshpilot.registry.serviceentry.controller import ServiceEntryRegistry


class _Updater:
    def __init__(self, index: EndpointIndex) -> None:
        self.index = index

    def config_update(self, request: Any) -> None:
        pass

    def eds_update(self, shard: Any, hostname: str, namespace: str, endpoints: Any) -> None:
        self.index.update_service_endpoints(shard, hostname, namespace, endpoints)

    def service_update(self, shard: Any, hostname: str, namespace: str, deleted: bool) -> None:
        pass

    def proxy_update(self, cluster_id: str, ip: str) -> None:
        pass


def build_model(
    *, services: int, endpoints: int, destination_rules: int = 0, rule_policies: int = 10
) -> tuple[Any, Proxy]:
    """The scenario's model and its first sidecar; ``destination_rules`` services get the scenario's
    rule, with ``rule_policies`` distinct traffic policies among them."""
    scenario = Scenario(
        "micro",
        services=services,
        endpoints_per_service=endpoints,
        proxies=1,
        destination_rules=destination_rules,
        rule_policies=rule_policies,
    )
    store, index = ConfigStore(), EndpointIndex()
    updater = _Updater(index)
    kube = KubeRegistry(updater)
    entries = ServiceEntryRegistry(store, updater)
    env = MeshEnvironment(
        store=store, registry=AggregateRegistry([kube], [entries]), index=index, mesh=default_mesh_config()
    )
    for docs in scenario.objects().values():
        for doc in docs:
            obj = decode_object(doc).obj
            if isinstance(obj, Config):
                store.upsert(obj)
            else:
                kube.upsert(obj)
    push: PushContext = env.build_push_context("micro/1")
    node_id, ip, namespace, labels = scenario.proxy(0)
    proxy = parse_proxy(
        node_id, NodeMetadata.parse({"NAMESPACE": namespace, "LABELS": labels, "INSTANCE_IPS": ip})
    )
    env.refresh_proxy(proxy, push)

    class Model:
        pass

    model = Model()
    model.push = push  # type: ignore[attr-defined]
    model.index = index  # type: ignore[attr-defined]
    return model, proxy
