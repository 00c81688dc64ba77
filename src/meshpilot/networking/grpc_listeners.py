"""Listeners for proxyless gRPC (istiod's grpcgen LDS).

A gRPC client asks for listeners by the name it dials: ``xds:///reviews:9080``
asks for ``reviews:9080``. It gets an *API listener* of that name: no socket,
only an HttpConnectionManager that names the route configuration to fetch
(``outbound|9080||reviews.default.svc.cluster.local``, a cluster-style name,
as istiod names it). Short names resolve in the client's own namespace.

A gRPC server built with xDS asks for ``xds.istio.io/grpc/lds/inbound/HOST:PORT``
and gets a listener with one filter chain, plaintext or mTLS as its PeerAuthentication
says (``inbound_mode``), whose inline route only marks requests as accepted (gRPC
serves them itself). Its HTTP filters are the RBAC filters of the AuthorizationPolicies selecting the
server (``grpc_rbac``), then the router.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from envoy.config.core.v3 import address_pb2, config_source_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.http.fault.v3 import fault_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)

from meshpilot.config.validation import goparse
from meshpilot.model import labels
from meshpilot.model.endpoint import TLS_MODE_ISTIO
from meshpilot.model.peer_authentication import PERMISSIVE_WORKLOAD, MtlsMode, WorkloadMtls
from meshpilot.model.proxy import Proxy
from meshpilot.model.service import Service
from meshpilot.networking import grpc_tls, names
from meshpilot.networking.protobuf import pack

log = logging.getLogger(__name__)

#: The resource name prefix a gRPC xDS server asks for (istio-agent's grpc bootstrap template).
INBOUND_PREFIX = "xds.istio.io/grpc/lds/inbound/"


@dataclass(slots=True)
class RequestedHost:
    """The names under which one host was asked for, and on which ports."""

    requested: set[str] = field(default_factory=set)
    #: Port numbers as text; empty means every port of the service.
    ports: set[str] = field(default_factory=set)

    def includes_port(self, port: str) -> bool:
        return not self.ports or port in self.ports


@dataclass(slots=True)
class ListenerRequest:
    """What a gRPC LDS request asks for, by host (FQDN and the names asked for)."""

    hosts: dict[str, RequestedHost] = field(default_factory=dict)
    inbound: list[str] = field(default_factory=list)

    def lookup(self, hostname: str) -> RequestedHost | None:
        if not self.hosts and not self.inbound:
            # No names at all: every service, under its own name (as istiod).
            return RequestedHost({hostname})
        return self.hosts.get(hostname)


def split_host_port(name: str) -> tuple[str, str] | None:
    """``host:port`` or ``[v6]:port`` split as Go's net.SplitHostPort; None if it is not one."""
    try:
        return goparse.split_host_port(name)
    except goparse.GoParseError:
        return None


def join_host_port(host: str, port: str) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def fqdn_for(name: str, proxy: Proxy) -> str:
    """The FQDN of a short name in the client's namespace, or "" (istiod's tryFindFQDN)."""
    domain = proxy.dns_domain
    if "." not in name:
        return f"{name}.{domain}"
    namespace = proxy.metadata.namespace
    for suffix in (namespace, namespace + ".svc"):
        short = name.removesuffix("." + suffix)
        if short != name and domain.startswith(suffix):
            return f"{short}.{domain}"
    return ""


def parse_listener_names(requested_names: Iterable[str], proxy: Proxy) -> ListenerRequest:
    """The hosts and ports asked for (a name both as asked and as FQDN), and the server listeners."""
    out = ListenerRequest()
    for name in sorted(requested_names):
        if name.startswith(INBOUND_PREFIX):
            out.inbound.append(name)
            continue
        split = split_host_port(name)
        requested = split[0] if split is not None else name
        fqdn = fqdn_for(requested, proxy)
        for host in (requested, fqdn) if fqdn else (requested,):
            entry = out.hosts.get(host)
            fresh = entry is None
            if entry is None:
                entry = out.hosts[host] = RequestedHost()
            entry.requested.add(requested)
            if split is None:
                entry.ports.clear()  # a name without a port asks for every port
            elif fresh or entry.ports:
                entry.ports.add(split[1])
    return out


def _router_filter() -> Any:
    return hcm_pb2.HttpFilter(name="envoy.filters.http.router", typed_config=pack(router_pb2.Router()))


def _fault_filter() -> Any:
    return hcm_pb2.HttpFilter(name="envoy.filters.http.fault", typed_config=pack(fault_pb2.HTTPFault()))


def _address(host: str, port: int) -> Any:
    return address_pb2.Address(socket_address=address_pb2.SocketAddress(address=host, port_value=port))


def api_listener(name: str, svc: Service, port: int) -> Any:
    """An outbound API listener: fault and router filters, routes from RDS over ADS."""
    hcm = hcm_pb2.HttpConnectionManager(http_filters=[_fault_filter(), _router_filter()])
    hcm.rds.config_source.CopyFrom(
        config_source_pb2.ConfigSource(ads=config_source_pb2.AggregatedConfigSource())
    )
    hcm.rds.route_config_name = names.outbound_cluster(port, "", svc.hostname)
    out = listener_pb2.Listener(name=name, address=_address(svc.default_address, port))
    out.api_listener.api_listener.CopyFrom(pack(hcm))
    return out


def outbound_listeners(proxy: Proxy, request: ListenerRequest) -> list[Any]:
    """One API listener per service port and per name it was asked for, in scope order."""
    scope = proxy.sidecar_scope
    if scope is None:
        return []
    out = []
    seen: set[str] = set()
    for svc in scope.services:
        wanted = request.lookup(svc.hostname)
        if wanted is None:
            continue
        # gRPC may watch both ``foo`` and ``foo.ns``: each name gets its own listener.
        for host in sorted(wanted.requested):
            for port in svc.ports:
                if not wanted.includes_port(str(port.port)):
                    continue
                name = join_host_port(host, str(port.port))
                if name not in seen:
                    seen.add(name)
                    out.append(api_listener(name, svc, port.port))
    return out


def _inbound_route() -> Any:
    # gRPC needs a route to accept a call but routes nothing itself (grpc-go issue 4924).
    route = rc.Route(match=rc.RouteMatch(prefix="/"), non_forwarding_action=rc.NonForwardingAction())
    return route_pb2.RouteConfiguration(
        name="inbound", virtual_hosts=[rc.VirtualHost(domains=["*"], routes=[route])]
    )


def inbound_filter_chain(suffix: str, mtls: bool, rbac_filters: Sequence[Any] = ()) -> Any:
    """A server listener's one chain; ``rbac_filters`` (``grpc_rbac.http_filters``) precede the router."""
    hcm = hcm_pb2.HttpConnectionManager(
        route_config=_inbound_route(), http_filters=[*rbac_filters, _router_filter()]
    )
    chain = listener_components_pb2.FilterChain(
        name="inbound-" + suffix,
        filters=[listener_components_pb2.Filter(name="inbound-hcm" + suffix, typed_config=pack(hcm))],
    )
    if mtls:
        chain.transport_socket.CopyFrom(grpc_tls.downstream_transport_socket())
    return chain


def inbound_mode(proxy: Proxy, mtls: WorkloadMtls, port: int) -> MtlsMode:
    """The mode of a gRPC server's port, as istiod's grpcgen decides it: the PeerAuthentication
    mode, except that gRPC cannot serve both on one port, so PERMISSIVE becomes STRICT for a
    workload clients reach with mTLS (``security.istio.io/tlsMode: istio``), else plaintext."""
    mode = mtls.for_port(port)
    if mode is MtlsMode.PERMISSIVE:
        mtls_label = proxy.labels.get(labels.TLS_MODE) == TLS_MODE_ISTIO
        return MtlsMode.STRICT if mtls_label else MtlsMode.DISABLE
    return MtlsMode.DISABLE if mode is MtlsMode.UNKNOWN else mode


def inbound_listener(
    name: str, proxy: Proxy, mtls: WorkloadMtls = PERMISSIVE_WORKLOAD, rbac_filters: Sequence[Any] = ()
) -> Any | None:
    """The server listener for ``xds.istio.io/grpc/lds/inbound/HOST:PORT``; None if not served here.

    ``mtls`` is the workload's PeerAuthentication (``PeerAuthenticationIndex.for_workload``),
    ``rbac_filters`` its AuthorizationPolicies' filters (``grpc_rbac.http_filters``).
    """
    split = split_host_port(name.removeprefix(INBOUND_PREFIX))
    if split is None or not split[1].isdigit():
        log.warning("%s: cannot parse an address from gRPC listener name %r", proxy.id, name)
        return None
    host, port = split[0], int(split[1])
    if not any(t.target_port == port for t in proxy.service_targets):
        log.warning("%s: no service port targets %d (gRPC listener %r)", proxy.id, port, name)
        return None
    strict = inbound_mode(proxy, mtls, port) is MtlsMode.STRICT
    chain = inbound_filter_chain("mtls" if strict else "plaintext", strict, rbac_filters)
    # Listener filters and use_original_dst must stay unset: gRPC rejects them.
    return listener_pb2.Listener(name=name, address=_address(host, port), filter_chains=[chain])


def inbound_listeners(
    proxy: Proxy,
    request: ListenerRequest,
    mtls: WorkloadMtls = PERMISSIVE_WORKLOAD,
    rbac_filters: Sequence[Any] = (),
) -> list[Any]:
    out = []
    for name in request.inbound:
        listener = inbound_listener(name, proxy, mtls, rbac_filters)
        if listener is not None:
            out.append(listener)
    return out
