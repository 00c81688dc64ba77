"""One proxy's configuration as the server would send it now, in Envoy's admin ``ConfigDump`` shape.

``/debug/config_dump?proxyID=`` and the ``istio.io/debug/config_dump`` xDS type both serve this, and
``istioctl proxy-status <pod>`` compares it with the dump of the proxy's own Envoy admin. The sections
and their order are istiod's: bootstrap (empty), clusters, endpoints (only when asked for), listeners,
scoped routes (empty), routes, secrets, extension configs (none: meshpilot serves no ECDS).
Per-resource ``version_info`` is set where istiod sets it; istioctl strips it anyway.

Secrets are hidden here, once for both views (``redaction.redact_message``): an SDS private key, and
a key or password an EnvoyFilter inlined into a listener's or a cluster's TLS context, become
``[redacted]``, as Envoy's own dump shows them.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from envoy.admin.v3 import config_dump_pb2, config_dump_shared_pb2
from envoy.config.listener.v3 import listener_pb2

from meshpilot.model.push_context import PushContext
from meshpilot.model.push_request import PushRequest
from meshpilot.networking.protobuf import pack
from meshpilot.xds.connection import Connection
from meshpilot.xds.generators.base import GenerationContext
from meshpilot.xds.introspect import ConnectedProxies
from meshpilot.xds.redaction import redact_message
from meshpilot.xds.types import TypeUrl


def config_dump(
    proxies: ConnectedProxies, conn: Connection, push: PushContext, *, include_eds: bool = False
) -> Any:
    """``conn``'s configuration generated from ``push``, for the types it watches, secrets hidden."""
    ctx = GenerationContext(
        conn.proxy,
        push,
        proxies.index,
        PushRequest(full=True, forced=True, reasons=Counter(), push=push),
        identity=conn.identity,
    )
    generators = proxies.generators_for(conn.proxy)

    def generate(type_url: TypeUrl) -> list[Any]:
        watch = conn.watched.get(type_url)
        generator = generators.get(type_url)
        if watch is None or generator is None:
            return []
        return [r.message() for r in generator.generate(ctx, watch, None) or []]

    version = push.version
    clusters = config_dump_shared_pb2.ClustersConfigDump(version_info=version)
    for cluster in generate(TypeUrl.CLUSTER):
        clusters.dynamic_active_clusters.add(cluster=cluster)
    listeners = config_dump_shared_pb2.ListenersConfigDump(version_info=version)
    for listener in generate(TypeUrl.LISTENER):
        entry = listeners.dynamic_listeners.add(name=_name(listener, listener_pb2.Listener))
        entry.active_state.version_info = version
        entry.active_state.listener.CopyFrom(listener)
    routes = config_dump_shared_pb2.RoutesConfigDump()
    for route in generate(TypeUrl.ROUTE):
        routes.dynamic_route_configs.add(version_info=version, route_config=route)
    secrets = config_dump_pb2.SecretsConfigDump()
    for secret in generate(TypeUrl.SECRET):
        secrets.dynamic_active_secrets.add(version_info=version, secret=secret)
    sections: list[Any] = [config_dump_pb2.BootstrapConfigDump(), clusters]
    if include_eds:
        endpoints = config_dump_shared_pb2.EndpointsConfigDump()
        for cla in generate(TypeUrl.ENDPOINT):
            endpoints.dynamic_endpoint_configs.add(version_info=version, endpoint_config=cla)
        sections.append(endpoints)
    sections += [
        listeners,
        config_dump_shared_pb2.ScopedRoutesConfigDump(),
        routes,
        secrets,
        config_dump_shared_pb2.EcdsConfigDump(),
    ]
    # Each section holds copies of the generated resources, so hiding in place leaves the cache alone.
    for section in sections:
        redact_message(section)
    return config_dump_pb2.ConfigDump(configs=[pack(s) for s in sections])


def _name(packed: Any, message_type: Any) -> str:
    message = message_type()
    packed.Unpack(message)
    return str(message.name)
