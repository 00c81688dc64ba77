"""istiod's /debug endpoints, in istiod's JSON shapes."""

from __future__ import annotations

import datetime
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from google.protobuf import json_format

from meshpilot.config.schemas import SCHEMAS
from meshpilot.config.store import ConfigStore
from meshpilot.model.endpoint import Endpoint
from meshpilot.model.endpoint_index import EndpointIndex
from meshpilot.model.push_request import TriggerReason
from meshpilot.model.service import Resolution, Service
from meshpilot.push.explain_page import explain_page
from meshpilot.server.debug_access import SCOPE
from meshpilot.server.debug_ui import ui_page
from meshpilot.server.push_status import push_status_page
from meshpilot.server.redaction import adsz_metadata, redact
from meshpilot.xds.config_dump import config_dump
from meshpilot.xds.connection import Connection
from meshpilot.xds.introspect import find_connection, sorted_connections
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


#: A debug page: the query and the namespace the caller is limited to ("" for all) in, a response out.
Page = Callable[[Mapping[str, str], str], web.Response]
#: A page whose answer is gathered from other processes (a push-worker pool's: ``pool.debug_pages``).
AsyncPage = Callable[[Mapping[str, str], str], Awaitable[web.Response]]


class DebugHandlers:
    """The pages, served over HTTP (``routes``) and by name over xDS (``render``, ``istio.io/debug``)."""

    def __init__(self, sources: DebugSources) -> None:
        self.sources = sources
        self.pages: dict[str, Page] = {
            "syncz": self.syncz,
            "config_dump": self.config_dump,
            "configz": self.configz,
            "registryz": self.registryz,
            "endpointz": self.endpointz,
            "endpointShardz": self.endpointz,
            "adsz": self.adsz,
            "connections": self.connections,
            "list": self.list_pages,
            "explain": explain_page(sources.server),
            "push_status": push_status_page(sources.server),
            "ui": ui_page(sources.server),
        }

    def routes(self) -> list[web.RouteDef]:
        return [page_route(name, page) for name, page in self.pages.items()]

    def render(self, page: str, query: Mapping[str, str], scope: str) -> tuple[int, bytes]:
        """``/debug/<page>?<query>`` as the xDS debug type carries it (``generators.debug.DebugPages``)."""
        found = self.pages.get(page)
        if found is None:
            # The text istioctl looks for before it lists the pages.
            return 404, b"404 page not found\n"
        response = found(query, scope)
        body = response.body
        return response.status, body if isinstance(body, bytes) else b""

    def syncz(self, query: Mapping[str, str], scope: str = "") -> web.Response:
        namespace = query.get("namespace", "")
        if scope and namespace not in ("", scope):
            return _json([])
        conns = sorted_connections(self.sources.server, namespace or scope)
        return _json([sync_status(c) for c in conns])

    def registryz(self, query: Mapping[str, str], scope: str = "") -> web.Response:
        services = sorted(self.sources.services(), key=lambda s: (s.hostname, s.namespace))
        return _json([service_json(s) for s in services])

    def endpointz(self, query: Mapping[str, str], scope: str = "") -> web.Response:
        out: dict[str, dict[str, Any]] = {}
        for hostname, namespace, shards in self.sources.index.services():
            out.setdefault(hostname, {})[namespace] = {
                "Shards": {
                    str(key): [endpoint_json(ep) for ep in eps] for key, eps in sorted(shards.shards.items())
                },
                "ServiceAccounts": {sa: {} for sa in sorted(shards.service_accounts)},
            }
        return _json(out)

    def configz(self, query: Mapping[str, str], scope: str = "") -> web.Response:
        store = self.sources.store
        configs = [c for kind in store.kinds() for c in store.configs(kind)]
        return _json(redact([config_json(c) for c in configs]))

    def connections(self, query: Mapping[str, str], scope: str = "") -> web.Response:
        conns = sorted_connections(self.sources.server, scope)
        out: dict[str, Any] = {"totalClients": len(conns)}
        if conns:
            out["clients"] = [
                {"connectionId": c.id, "connectedAt": _iso(c.connected_at), "address": c.peer} for c in conns
            ]
        return _json(out)

    def list_pages(self, query: Mapping[str, str], scope: str = "") -> web.Response:
        return _json(sorted(name for name in self.pages if name != "list"))

    def adsz(self, query: Mapping[str, str], scope: str = "") -> web.Response:
        server = self.sources.server
        if query.get("push") == "true":
            server.push_all(TriggerReason.DEBUG)
        wanted = query.get("proxyID", "")
        clients = []
        for conn in sorted_connections(server, scope):
            if wanted and wanted not in conn.id:
                continue
            proxy = conn.proxy
            clients.append(
                {
                    "connectionId": conn.id,
                    "connectedAt": _iso(conn.connected_at),
                    "address": conn.peer,
                    "labels": proxy.labels or None,
                    "metadata": adsz_metadata(proxy.metadata.raw),
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

    def config_dump(self, query: Mapping[str, str], scope: str = "") -> web.Response:
        proxy_id = query.get("proxyID", "")
        if not proxy_id:
            return web.Response(status=400, text="You must provide a proxyID in the query string\n")
        server = self.sources.server
        conn = find_connection(server, proxy_id, scope)
        push = server.push_context
        if conn is None or push is None:
            return web.Response(
                status=404,
                text="Proxy not connected to this Pilot instance. It may be connected to another instance.\n",
            )
        # Secrets are already redacted, as over xDS (``xds.config_dump``). Field names as Envoy's own
        # /config_dump writes them, so the two can be diffed.
        dump = config_dump(server, conn, push, include_eds="include_eds" in query)
        return _json(json_format.MessageToDict(dump, preserving_proto_field_name=True))


def page_route(name: str, page: Page | AsyncPage) -> web.RouteDef:
    """``/debug/<name>`` over HTTP: the page reads only the query, and the scope the access middleware
    (``server.debug_access``) decided. Without that decision the page is not served."""

    async def handler(request: web.Request) -> web.Response:
        scope = request.get(SCOPE)
        if scope is None:
            return web.Response(status=403, text="debug access is not configured\n")
        response = page(request.query, scope)
        return await response if inspect.isawaitable(response) else response

    return web.get(f"/debug/{name}", handler)
