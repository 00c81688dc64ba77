"""istiod's /debug endpoints, in istiod's JSON shapes."""

from __future__ import annotations

import datetime
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from envoy.admin.v3 import config_dump_pb2, config_dump_shared_pb2
from envoy.config.listener.v3 import listener_pb2
from google.protobuf import json_format

from meshpilot.config.schemas import SCHEMAS
from meshpilot.config.store import ConfigStore
from meshpilot.model.endpoint import Endpoint
from meshpilot.model.endpoint_index import EndpointIndex
from meshpilot.model.push_request import PushRequest, TriggerReason
from meshpilot.model.service import Resolution, Service
from meshpilot.networking.protobuf import pack
from meshpilot.xds.connection import Connection
from meshpilot.xds.generators.base import GenerationContext
from meshpilot.xds.server import DiscoveryServer
from meshpilot.xds.types import TypeUrl

#: istiod's model.Resolution numbers.
_RESOLUTION_NUMBERS = {
    Resolution.CLIENT_SIDE_LB: 0,
    Resolution.DNS_LB: 1,
    Resolution.PASSTHROUGH: 2,
    Resolution.DNS_ROUND_ROBIN_LB: 3,
    Resolution.ALIAS: 4,
}


@dataclass(frozen=True, slots=True)
class DebugSources:
    server: DiscoveryServer
    store: ConfigStore
    index: EndpointIndex
    services: Callable[[], list[Service]]


def _json(data: Any) -> web.Response:
    return web.Response(body=orjson.dumps(data, option=orjson.OPT_INDENT_2), content_type="application/json")


def _iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat().replace("+00:00", "Z")


def sync_status(conn: Connection) -> dict[str, Any]:
    def nonce(type_url: str, acked: bool) -> str:
        watch = conn.watched.get(type_url)
        if watch is None:
            return ""
        return watch.nonce_acked if acked else watch.nonce_sent

    proxy = conn.proxy
    out: dict[str, Any] = {
        "cluster_id": proxy.cluster_id,
        "proxy": proxy.id,
        "proxy_type": proxy.type.value,
        "istio_version": proxy.metadata.istio_version,
    }
    for prefix, type_url in (
        ("cluster", TypeUrl.CLUSTER),
        ("listener", TypeUrl.LISTENER),
        ("route", TypeUrl.ROUTE),
        ("endpoint", TypeUrl.ENDPOINT),
        ("extensionconfig", "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig"),
    ):
        out[f"{prefix}_sent"] = nonce(type_url, acked=False)
        out[f"{prefix}_acked"] = nonce(type_url, acked=True)
    out["resources"] = {
        w.type_url: {
            "sent": w.nonce_sent,
            "acked": w.nonce_acked,
            "sentTime": _iso(w.last_sent) if w.last_sent else None,
            "lastError": w.last_error,
        }
        for w in conn.watched.values()
    }
    return {k: v for k, v in out.items() if v not in ("", None)}


def service_json(svc: Service) -> dict[str, Any]:
    return {
        "Attributes": {
            "ServiceRegistry": svc.registry.value,
            "Name": svc.name,
            "Namespace": svc.namespace,
            "Labels": svc.labels or None,
            "ExportTo": sorted(svc.export_to) or None,
            "LabelSelectors": svc.selector,
            "K8sAttributes": {
                "Type": svc.kube_type,
                "ExternalName": svc.external_name,
                "NodeLocal": svc.node_local,
            },
        },
        "ports": [{"name": p.name, "port": p.port, "protocol": p.protocol.value} for p in svc.ports],
        "serviceAccounts": list(svc.service_accounts) or None,
        "creationTime": svc.creation_timestamp or None,
        "hostname": svc.hostname,
        "clusterVIPs": {"Addresses": {svc.cluster_id: list(svc.addresses) or [svc.default_address]}},
        "defaultAddress": svc.default_address,
        "Resolution": _RESOLUTION_NUMBERS[svc.resolution],
        "MeshExternal": svc.mesh_external,
    }


def endpoint_json(ep: Endpoint) -> dict[str, Any]:
    return {
        "Labels": ep.labels,
        "Addresses": [ep.address, *ep.extra_addresses],
        "ServicePortName": ep.service_port_name,
        "ServiceAccount": ep.service_account,
        "Network": ep.network,
        "Locality": {"Label": ep.locality.label, "ClusterID": ep.locality.cluster_id},
        "EndpointPort": ep.port,
        "LbWeight": ep.weight,
        "TLSMode": ep.tls_mode,
        "Namespace": ep.namespace,
        "WorkloadName": ep.workload_name,
        "HostName": ep.hostname,
        "SubDomain": ep.subdomain,
        "HealthStatus": int(ep.health),
        "NodeName": ep.node_name,
    }


def config_json(config: Any) -> dict[str, Any]:
    meta = config.meta
    schema = SCHEMAS[meta.kind]
    metadata: dict[str, Any] = {"name": meta.name, "namespace": meta.namespace}
    if meta.labels:
        metadata["labels"] = meta.labels
    if meta.annotations:
        metadata["annotations"] = meta.annotations
    if meta.resource_version:
        metadata["resourceVersion"] = meta.resource_version
    if meta.creation_timestamp:
        metadata["creationTimestamp"] = meta.creation_timestamp
    return {
        "kind": meta.kind.value,
        "apiVersion": meta.api_version or schema.api_version,
        "metadata": metadata,
        "spec": json_format.MessageToDict(config.spec),
    }


def _unpack_name(packed: Any, message_type: Any) -> str:
    message = message_type()
    packed.Unpack(message)
    return str(message.name)


class DebugHandlers:
    def __init__(self, sources: DebugSources) -> None:
        self.sources = sources

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/debug/syncz", self.syncz),
            web.get("/debug/config_dump", self.config_dump),
            web.get("/debug/configz", self.configz),
            web.get("/debug/registryz", self.registryz),
            web.get("/debug/endpointz", self.endpointz),
            web.get("/debug/endpointShardz", self.endpointz),
            web.get("/debug/adsz", self.adsz),
        ]

    async def syncz(self, request: web.Request) -> web.Response:
        namespace = request.query.get("namespace", "")
        conns = sorted(self.sources.server.connections.values(), key=lambda c: c.id)
        return _json(
            [sync_status(c) for c in conns if not namespace or c.proxy.config_namespace == namespace]
        )

    async def registryz(self, request: web.Request) -> web.Response:
        services = sorted(self.sources.services(), key=lambda s: (s.hostname, s.namespace))
        return _json([service_json(s) for s in services])

    async def endpointz(self, request: web.Request) -> web.Response:
        out: dict[str, dict[str, Any]] = {}
        for hostname, namespace, shards in self.sources.index.services():
            out.setdefault(hostname, {})[namespace] = {
                "Shards": {
                    str(key): [endpoint_json(ep) for ep in eps] for key, eps in sorted(shards.shards.items())
                },
                "ServiceAccounts": {sa: {} for sa in sorted(shards.service_accounts)},
            }
        return _json(out)

    async def configz(self, request: web.Request) -> web.Response:
        store = self.sources.store
        configs = [c for kind in store.kinds() for c in store.configs(kind)]
        return _json([config_json(c) for c in configs])

    async def adsz(self, request: web.Request) -> web.Response:
        server = self.sources.server
        if request.query.get("push") == "true":
            server.push_all(TriggerReason.DEBUG)
        wanted = request.query.get("proxyID", "")
        clients = []
        for conn in sorted(server.connections.values(), key=lambda c: c.id):
            if wanted and wanted not in conn.id:
                continue
            proxy = conn.proxy
            clients.append(
                {
                    "connectionId": conn.id,
                    "connectedAt": _iso(conn.connected_at),
                    "address": conn.peer,
                    "labels": proxy.labels or None,
                    "metadata": proxy.metadata.raw,
                    "locality": {
                        k: v
                        for k, v in zip(
                            ("region", "zone", "subZone"),
                            (proxy.locality.region, proxy.locality.zone, proxy.locality.subzone),
                            strict=True,
                        )
                        if v
                    }
                    or None,
                    "watches": {w.type_url: sorted(w.names) for w in conn.watched.values()},
                }
            )
        return _json({"totalClients": len(clients), "clients": clients})

    async def config_dump(self, request: web.Request) -> web.Response:
        proxy_id = request.query.get("proxyID", "")
        if not proxy_id:
            return web.Response(status=400, text="You must provide a proxyID in the query string\n")
        server = self.sources.server
        conn = next((c for c in server.connections.values() if proxy_id in c.id), None)
        push = server.push_context
        if conn is None or push is None:
            return web.Response(
                status=404,
                text="Proxy not connected to this Pilot instance. It may be connected to another instance.\n",
            )
        include_eds = "include_eds" in request.query
        ctx = GenerationContext(
            conn.proxy,
            push,
            server.env.index,
            PushRequest(full=True, forced=True, reasons=Counter(), push=push),
        )
        dump = config_dump_pb2.ConfigDump()

        def generate(type_url: TypeUrl) -> list[Any]:
            watch = conn.watched.get(type_url)
            generator = server.generators_for(conn.proxy).get(type_url)
            if watch is None or generator is None:
                return []
            return [r.message() for r in generator.generate(ctx, watch, None) or []]

        version = push.version
        clusters = config_dump_shared_pb2.ClustersConfigDump(version_info=version)
        for cluster in generate(TypeUrl.CLUSTER):
            clusters.dynamic_active_clusters.add(version_info=version, cluster=cluster)
        dump.configs.append(pack(clusters))
        listeners = config_dump_shared_pb2.ListenersConfigDump(version_info=version)
        for listener in generate(TypeUrl.LISTENER):
            entry = listeners.dynamic_listeners.add(name=_unpack_name(listener, listener_pb2.Listener))
            entry.active_state.version_info = version
            entry.active_state.listener.CopyFrom(listener)
        dump.configs.append(pack(listeners))
        routes = config_dump_shared_pb2.RoutesConfigDump()
        for route in generate(TypeUrl.ROUTE):
            routes.dynamic_route_configs.add(version_info=version, route_config=route)
        dump.configs.append(pack(routes))
        if include_eds:
            endpoints = config_dump_shared_pb2.EndpointsConfigDump()
            for cla in generate(TypeUrl.ENDPOINT):
                endpoints.dynamic_endpoint_configs.add(version_info=version, endpoint_config=cla)
            dump.configs.append(pack(endpoints))
        # Field names as Envoy's own /config_dump writes them, so the two can be diffed.
        text = json_format.MessageToJson(dump, indent=2, preserving_proto_field_name=True)
        return web.Response(text=text, content_type="application/json")
