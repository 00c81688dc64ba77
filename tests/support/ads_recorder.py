"""An ADS client that subscribes as Envoy does and records what later pushes change, for comparing
what a change preview predicted with what the server then sends.

It asks for clusters and listeners whole, then the routes the listeners name and the endpoints of the
EDS clusters (state-of-the-world or delta), acknowledges every response, and keeps what it holds by
type and name. ``record`` reads responses until the server is quiet and returns what they changed:
(type, name, "changed" | "added" | "removed"), and the resources sent again unchanged.
"""

from __future__ import annotations

from typing import Any

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from google.protobuf import json_format
from support.ads_client import AdsClient, DeltaClient
from support.golden import rds_names

from meshpilot.xds.types import TypeUrl, parse_type_url

_MESSAGES: dict[TypeUrl, Any] = {
    TypeUrl.CLUSTER: cluster_pb2.Cluster,
    TypeUrl.LISTENER: listener_pb2.Listener,
    TypeUrl.ROUTE: route_pb2.RouteConfiguration,
    TypeUrl.ENDPOINT: endpoint_pb2.ClusterLoadAssignment,
}

Seen = set[tuple[str, str, str]]


def _name(type_url: TypeUrl, value: bytes) -> str:
    message = _MESSAGES[type_url].FromString(value)
    return str(message.cluster_name if type_url is TypeUrl.ENDPOINT else message.name)


class Recorder:
    """One proxy's stream; ``delta`` picks the protocol."""

    def __init__(self, target: str, node_id: str, metadata: dict[str, Any], *, delta: bool) -> None:
        self.delta = delta
        self.node = (node_id, metadata)
        self.client: AdsClient | DeltaClient = DeltaClient(target) if delta else AdsClient(target)
        #: type -> name -> serialized resource, as the proxy holds it.
        self.held: dict[TypeUrl, dict[str, bytes]] = {t: {} for t in _MESSAGES}
        self.watched: dict[TypeUrl, list[str]] = {}

    async def subscribe(self) -> None:
        await self._ask(TypeUrl.CLUSTER, None)
        await self._ask(TypeUrl.LISTENER, None)
        listeners = [
            json_format.MessageToDict(listener_pb2.Listener.FromString(v), preserving_proto_field_name=True)
            for v in self.held[TypeUrl.LISTENER].values()
        ]
        routes = sorted(rds_names(listeners))
        if routes:
            await self._ask(TypeUrl.ROUTE, routes)
        eds = sorted(
            n
            for n, v in self.held[TypeUrl.CLUSTER].items()
            if cluster_pb2.Cluster.FromString(v).type == cluster_pb2.Cluster.EDS
        )
        if eds:
            await self._ask(TypeUrl.ENDPOINT, eds)
        # Anything the subscriptions set off (a delta stream resends endpoints of warming clusters).
        await self.record(quiet=0.5)

    async def _ask(self, type_url: TypeUrl, names: list[str] | None) -> None:
        wanted = names or []
        self.watched[type_url] = wanted
        node_id, metadata = self.node
        self.client.send(type_url.value, wanted, node_id=node_id, node_metadata=metadata)
        response = await self.client.recv()
        self._apply(response)

    def _apply(self, response: Any) -> tuple[Seen, Seen]:
        """Record ``response`` and acknowledge it; (what it changed, what it sent again unchanged)."""
        type_url = TypeUrl(response.type_url)
        held = self.held[type_url]
        changed: Seen = set()
        same: Seen = set()
        short = type_url.short
        if isinstance(self.client, DeltaClient):
            for r in response.resources:
                value = r.resource.value
                old = held.get(r.name)
                if old == value:
                    same.add((short, r.name, "same"))
                else:
                    changed.add((short, r.name, "added" if old is None else "changed"))
                held[r.name] = value
            for name in response.removed_resources:
                if held.pop(name, None) is not None:
                    changed.add((short, name, "removed"))
            self.client.ack(response)
        else:
            got = {_name(type_url, r.value): r.value for r in response.resources}
            for name, value in got.items():
                old = held.get(name)
                if old == value:
                    same.add((short, name, "same"))
                else:
                    changed.add((short, name, "added" if old is None else "changed"))
            if type_url.is_wildcard:
                for name in set(held) - set(got):
                    changed.add((short, name, "removed"))
                self.held[type_url] = got
            else:
                # Routes and endpoints are asked for by name: a response need not carry them all
                # (an endpoint push carries the changed ones), and Envoy keeps those it leaves out.
                held.update(got)
            self.client.ack(response, self.watched.get(type_url))
        return changed, same

    async def record(self, quiet: float = 1.5, first: float | None = None) -> tuple[Seen, Seen, set[str]]:
        """Responses until none comes for ``quiet`` seconds (``first`` for the first one, when given):
        (changes, unchanged resends, types sent). Responses wait in the client until read, so a
        recorder read after another saw a push still finds what the same push sent it."""
        changed: Seen = set()
        same: Seen = set()
        types: set[str] = set()
        wait = first if first is not None else quiet
        while True:
            try:
                response = await self.client.recv(timeout=wait)
            except TimeoutError:
                return changed, same, types
            wait = quiet
            known = parse_type_url(response.type_url)
            assert known is not None
            types.add(known.short)
            more, again = self._apply(response)
            changed |= more
            same |= again

    async def close(self) -> None:
        await self.client.close()
