"""An XdsUpdater that records what registries report."""

from __future__ import annotations

from collections.abc import Sequence

from meshpilot.model.endpoint import Endpoint
from meshpilot.model.endpoint_index import ShardKey
from meshpilot.model.push_request import PushRequest


class Updater:
    def __init__(self) -> None:
        self.endpoints: dict[str, list[Endpoint]] = {}
        self.services: list[tuple[str, bool]] = []
        self.proxies: list[str] = []
        self.eds_calls = 0
        self.requests: list[PushRequest] = []

    def config_update(self, request: PushRequest) -> None:
        self.requests.append(request)

    def eds_update(
        self, shard: ShardKey, hostname: str, namespace: str, endpoints: Sequence[Endpoint]
    ) -> None:
        self.endpoints[hostname] = list(endpoints)
        self.eds_calls += 1

    def service_update(self, shard: ShardKey, hostname: str, namespace: str, deleted: bool) -> None:
        self.services.append((hostname, deleted))

    def proxy_update(self, cluster_id: str, ip: str) -> None:
        self.proxies.append(ip)
