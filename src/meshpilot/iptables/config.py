"""What istio-iptables is asked to capture, parsed from its flags."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class NetworkRange:
    """A CIDR list flag (`-i`, `-x`) for one IP family: `*` or explicit networks."""

    wildcard: bool = False
    cidrs: tuple[Network, ...] = ()

    @property
    def has_loopback(self) -> bool:
        # An explicitly included loopback range means app-to-self traffic over lo is wanted
        # in Envoy, so the "lo and not Envoy -> RETURN" shortcut must not be emitted.
        return any(c.network_address.is_loopback for c in self.cidrs)


def split_list(text: str) -> list[str]:
    """Comma separated flag values, blanks dropped, as istio splits them."""
    return [part.strip() for part in text.split(",") if part.strip()]


def split_families(text: str) -> tuple[NetworkRange, NetworkRange]:
    """Splits a CIDR list flag into its IPv4 and IPv6 parts; `*` applies to both."""
    items = split_list(text)
    if "*" in items:
        return NetworkRange(wildcard=True), NetworkRange(wildcard=True)
    v4: list[Network] = []
    v6: list[Network] = []
    for item in items:
        net = ipaddress.ip_network(item, strict=False)
        (v4 if net.version == 4 else v6).append(net)
    return NetworkRange(cidrs=tuple(v4)), NetworkRange(cidrs=tuple(v6))


@dataclass(frozen=True)
class CaptureConfig:
    """istio-iptables' settings that shape the rules; defaults are istio's."""

    proxy_port: str = "15001"
    inbound_capture_port: str = "15006"
    inbound_tunnel_port: str = "15008"
    proxy_uid: str = "1337"
    proxy_gid: str = "1337"
    mode: str = "REDIRECT"
    inbound_ports_include: str = ""
    inbound_ports_exclude: str = ""
    outbound_ranges_include: str = ""
    outbound_ranges_exclude: str = ""
    outbound_ports_include: str = ""
    outbound_ports_exclude: str = ""
    reroute_interfaces: str = ""
    exclude_interfaces: str = ""
    tproxy_mark: str = "1337"
    tproxy_route_table: str = "133"
    host_loopback_v4: str = "127.0.0.1/32"
    ipv6: bool = False

    def __post_init__(self) -> None:
        if self.mode not in ("REDIRECT", "TPROXY"):
            raise ValueError(f"interception mode must be REDIRECT or TPROXY, not {self.mode!r}")
        v4_exclude, _ = split_families(self.outbound_ranges_exclude)
        if v4_exclude.wildcard:
            # istio refuses this too: excluding everything makes the include list meaningless.
            raise ValueError("invalid value for outbound IP ranges exclude: '*'")
        split_families(self.outbound_ranges_include)
