"""Route configurations for proxyless gRPC (istiod's grpcgen RDS).

gRPC asks for the route configuration its API listener names,
``outbound|PORT||FQDN``. It holds the virtual host of that one service as
a sidecar would get it on that port (VirtualService routes, or the default
route), with three differences istiod makes for proxyless clients:

- domains carry the port too (``reviews:9080``), because gRPC matches the
  authority it dials, port included, and does not ignore ports;
- a VirtualService timeout is sent as ``max_stream_duration``, which gRPC
  reads, instead of ``max_grpc_timeout``;
- only the name and the virtual hosts are set; gRPC ignores the rest.

One difference from istiod: per-route configs of filters the API listener
does not have (CORS from a VirtualService ``corsPolicy``) are dropped. gRPC
rejects the whole route configuration over one filter type it does not
know, so istiod's output leaves a client with no routes at all.

Like istiod's master branch (1.28 sends every service on the port), only the
virtual host of the requested service is kept, so a change to another
service on the same port does not change this configuration.
"""

from __future__ import annotations

import logging
from typing import Any

from envoy.config.route.v3 import route_pb2

from meshpilot.model.hosts import host_matches, is_wildcard
from meshpilot.model.proxy import Proxy
from meshpilot.model.push_context import PushContext
from meshpilot.networking import names
from meshpilot.networking.route import build_route_configuration

log = logging.getLogger(__name__)


def parse_route_name(name: str) -> tuple[str, int] | None:
    """(host, port) of a cluster-style route name; None for other names (istiod ignores them)."""
    parsed = names.parse_cluster(name)
    if parsed is None or not parsed[3] or parsed[1] == 0:
        return None
    return parsed[3], parsed[1]


def with_ports(domains: list[str], port: int) -> list[str]:
    """Each domain followed by the same with ``:port``, in istiod's order."""
    out = []
    for domain in domains:
        out += [domain, f"{domain}:{port}"]
    return out


def _serves(vhost: Any, host: str) -> bool:
    host = host.lower()
    for domain in vhost.domains:
        if domain == host or (is_wildcard(domain) and host_matches(host, domain)):
            return True
    return False


#: The HTTP filters of gRPC's API listener that take per-route config.
_LISTENER_FILTERS = frozenset({"envoy.filters.http.fault"})


def _drop_unknown_filter_configs(configs: Any) -> None:
    for name in [n for n in configs if n not in _LISTENER_FILTERS]:
        del configs[name]


def _for_proxyless(route: Any) -> None:
    """A route as gRPC can take it: known filter configs, the timeout as max_stream_duration."""
    _drop_unknown_filter_configs(route.typed_per_filter_config)
    for weighted in route.route.weighted_clusters.clusters:
        _drop_unknown_filter_configs(weighted.typed_per_filter_config)
    # istiod's setTimeout for proxyless clients: gRPC reads max_stream_duration.
    if route.WhichOneof("action") != "route" or "istio" not in route.metadata.filter_metadata:
        # Default routes are built without the proxy and keep max_grpc_timeout, as in istiod.
        return
    action = route.route
    action.max_stream_duration.max_stream_duration.CopyFrom(action.timeout)
    action.ClearField("max_grpc_timeout")


def build_grpc_route_configuration(
    proxy: Proxy, push: PushContext, name: str, by_port: dict[int, Any] | None = None
) -> Any | None:
    """The route configuration ``name``; None when the name does not name a service port.

    ``by_port`` keeps the sidecar route configuration of each port between calls, so a client
    asking for several services of one port has that port's routes built once.
    """
    parsed = parse_route_name(name)
    if parsed is None:
        log.warning("%s: gRPC RDS: cannot parse route name %r", proxy.id, name)
        return None
    host, port = parsed
    by_port = by_port if by_port is not None else {}
    sidecar = by_port.get(port)
    if sidecar is None:
        sidecar = by_port[port] = build_route_configuration(proxy, push, str(port))
    out = route_pb2.RouteConfiguration(name=name)
    for shared in sidecar.virtual_hosts:
        if shared.name in (names.ALLOW_ANY_VHOST, names.BLOCK_ALL_VHOST) or not _serves(shared, host):
            continue
        vhost = out.virtual_hosts.add()
        vhost.CopyFrom(shared)  # edited below; the port's configuration may serve other names
        domains = with_ports(list(vhost.domains), port)
        del vhost.domains[:]
        vhost.domains.extend(domains)
        _drop_unknown_filter_configs(vhost.typed_per_filter_config)
        for route in vhost.routes:
            _for_proxyless(route)
    return out
