"""The one way registries and config stores tell the xDS server about changes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from meshpilot.model.endpoint import Endpoint
from meshpilot.model.endpoint_index import ShardKey
from meshpilot.model.push_request import PushRequest


class XdsUpdater(Protocol):
    """Implemented by the discovery server; registries hold only this interface."""

    def config_update(self, request: PushRequest) -> None:
        """Something changed; ``request`` says what. Debounced before pushing."""

    def eds_update(
        self, shard: ShardKey, hostname: str, namespace: str, endpoints: Sequence[Endpoint]
    ) -> None:
        """Replace one shard's endpoints of a service."""

    def service_update(self, shard: ShardKey, hostname: str, namespace: str, deleted: bool) -> None:
        """A service was added, changed or deleted."""

    def proxy_update(self, cluster_id: str, ip: str) -> None:
        """The workload behind a proxy changed (for example its Pod's labels)."""
