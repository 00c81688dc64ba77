"""Hostnames as Istio compares them: wildcards, and short names resolved in a namespace."""

from __future__ import annotations

import ipaddress


def is_wildcard(host: str) -> bool:
    return host.startswith("*")


def host_matches(a: str, b: str) -> bool:
    """True when the two hosts can name a common host (either may be a wildcard)."""
    if a == b:
        return True
    a_wild, b_wild = is_wildcard(a), is_wildcard(b)
    if a_wild and b_wild:
        # "*.com" and "*.foo.com" overlap: the shorter suffix contains the longer.
        return b.endswith(a[1:]) if len(a) <= len(b) else a.endswith(b[1:])
    if a_wild:
        return b.endswith(a[1:])
    if b_wild:
        return a.endswith(b[1:])
    return False


def host_subset_of(host: str, pattern: str) -> bool:
    """True when every host that ``host`` names is also named by ``pattern``."""
    if host == pattern or pattern == "*":
        return True
    if not is_wildcard(pattern):
        return False
    if is_wildcard(host):
        return host[1:].endswith(pattern[1:])
    return host.endswith(pattern[1:])


def most_specific_match(host: str, candidates: list[str]) -> str | None:
    """The exact candidate, else the longest wildcard candidate matching ``host``."""
    if host in candidates:
        return host
    best = None
    for candidate in candidates:
        better = best is None or len(candidate) > len(best)
        if better and is_wildcard(candidate) and host_subset_of(host, candidate):
            best = candidate
    return best


def resolve_short_name(host: str, namespace: str, domain_suffix: str) -> str:
    """An FQDN for a host written in ``namespace``: ``reviews`` is ``reviews.<ns>.svc.<domain>``.

    Hosts with a dot, IP addresses and ``*`` are taken as written.
    """
    if not host or host == "*" or "." in host or ":" in host:
        return host
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    out = f"{host}.{namespace}" if namespace else host
    return f"{out}.svc.{domain_suffix}" if domain_suffix else out
