"""Istio Gateways as a gateway proxy (``router``) sees them: its servers, and what binds to them.

A router takes every Gateway whose selector matches its labels, in any
namespace (istiod's default; ``PILOT_SCOPE_GATEWAY_TO_NAMESPACE`` is off), and
merges their servers. A VirtualService binds a Gateway by ``name`` (in the
VirtualService's namespace), ``namespace/name``, or the legacy FQDN
``name.namespace.svc.<domain>``; its hosts are served where they match a
server's hosts, and a server host ``ns/host`` admits only VirtualServices of
``ns`` (``*`` any, ``.`` the Gateway's own).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from meshpilot.model.config import Config, ConfigKey
from meshpilot.model.hosts import host_subset_of, is_wildcard
from meshpilot.model.labels import selector_matches
from meshpilot.model.protocol import Protocol

#: The gateway name that means every sidecar in a VirtualService's ``gateways``.
MESH_GATEWAY = "mesh"


@dataclass(frozen=True, slots=True)
class ServerHost:
    #: The namespace whose VirtualServices may use the host; "*" for any.
    namespace: str
    host: str


@dataclass(frozen=True, slots=True)
class GatewayRef:
    """The Gateway routes are built for, and the domain its legacy FQDN name is under."""

    key: ConfigKey
    domain_suffix: str


@dataclass(frozen=True, slots=True)
class GatewayServer:
    """One ``servers`` entry of a Gateway."""

    gateway: ConfigKey
    port: int
    protocol: Protocol
    hosts: tuple[ServerHost, ...]
    #: The address to listen on; "" for every address.
    bind: str
    #: ``tls.httpsRedirect`` on a plaintext server: every request is redirected to HTTPS.
    https_redirect: bool
    #: ``tls.mode`` by name (``PASSTHROUGH``, ``SIMPLE``, ...); "" without ``tls``.
    tls_mode: str = ""
    #: The ``tls`` settings (an istio ServerTLSSettings), None without. Not compared: a message is not
    #: hashable, and a server is told apart by its Gateway, port and hosts.
    tls: Any = field(default=None, compare=False)
    #: ``port.name`` (part of an HTTPS server's route name) and the server's ``name`` (its stats prefix).
    port_name: str = ""
    name: str = ""

    @property
    def gateway_name(self) -> str:
        return f"{self.gateway.namespace}/{self.gateway.name}"


@dataclass(frozen=True, slots=True)
class MergedGateway:
    """The servers of every Gateway a router takes, in Gateway order (oldest first)."""

    servers: tuple[GatewayServer, ...]


def _server_hosts(hosts: Iterable[str], gateway_namespace: str) -> tuple[ServerHost, ...]:
    out = []
    for host in hosts:
        namespace, sep, name = host.partition("/")
        if not sep:
            namespace, name = "*", host
        elif namespace == ".":
            namespace = gateway_namespace
        out.append(ServerHost(namespace, name.lower()))
    return tuple(out)


def servers_of(config: Config) -> list[GatewayServer]:
    out = []
    for server in config.spec.servers:
        tls = server.tls if server.HasField("tls") else None
        out.append(
            GatewayServer(
                gateway=config.key,
                port=server.port.number,
                protocol=Protocol.parse(server.port.protocol),
                hosts=_server_hosts(server.hosts, config.namespace),
                bind=server.bind,
                https_redirect=bool(tls is not None and tls.https_redirect),
                tls_mode=tls.TLSmode.Name(tls.mode) if tls is not None else "",
                tls=tls,
                port_name=server.port.name,
                name=server.name,
            )
        )
    return out


def merge_gateways(gateways: Iterable[Config], labels: Mapping[str, str]) -> MergedGateway:
    """The Gateways (oldest first) whose selector matches a router's ``labels``, merged."""
    chosen = [g for g in gateways if selector_matches(dict(g.spec.selector), labels)]
    return MergedGateway(servers=tuple(s for g in chosen for s in servers_of(g)))


def binds_gateway(
    vs_namespace: str, vs_gateways: Iterable[str], gateway: ConfigKey, domain_suffix: str
) -> bool:
    """Whether a VirtualService's ``gateways`` name ``gateway``."""
    full = f"{gateway.namespace}/{gateway.name}"
    fqdn = f"{gateway.name}.{gateway.namespace}.svc.{domain_suffix}"
    for ref in vs_gateways:
        if ref in (full, fqdn):
            return True
        if "/" not in ref and ref == gateway.name and vs_namespace == gateway.namespace:
            return True
    return False


def gateway_match(refs: Iterable[str], vs_namespace: str, gateway: GatewayRef | None) -> bool:
    """Whether a route match's non-empty ``gateways`` name where the config is built: ``mesh`` for
    sidecars (``gateway`` None), else the gateway routes are built for."""
    if gateway is None:
        return MESH_GATEWAY in refs
    return binds_gateway(vs_namespace, refs, gateway.key, gateway.domain_suffix)


def served_hosts(vs_host: str, vs_namespace: str, server: GatewayServer) -> list[str]:
    """The hosts a VirtualService host is served as on ``server``: where it meets each server host
    its namespace may use, the narrower of the two (``*.foo.com`` on ``a.foo.com`` and ``b.foo.com``
    is both)."""
    out: list[str] = []
    for allowed in server.hosts:
        if allowed.namespace not in ("*", vs_namespace):
            continue
        if host_subset_of(vs_host, allowed.host):
            found = vs_host
        elif is_wildcard(vs_host) and host_subset_of(allowed.host, vs_host):
            found = allowed.host
        else:
            continue
        if found not in out:
            out.append(found)
    return out
