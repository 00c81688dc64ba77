"""Default virtual hosts shared by the namespaces whose route configurations differ only in their own.

A sidecar's route configuration for a port holds a default virtual host per service, and its
domains depend on the proxy's namespace only for that namespace's own services (their short names:
``reviews`` besides ``reviews.shop``). Encoded once per snapshot as seen from no namespace, the hosts
serve every namespace: each re-encodes its own services' hosts and keeps the rest. That is exact only
where the names it adds meet no other domain (an earlier host would have taken one, or one would
have taken a later host's); where one might, the namespace encodes every host itself. The same holds
for the namespace's VirtualService hosts, whose domains the default hosts may not take: seen from
another namespace they differ only by such bare names, so the pass from nowhere leaves those out and
each namespace adds its own back.

Sharing pays only where a namespace names few of the services: it re-encodes its own hosts, checks
their names, and copies the rest. A namespace naming half of them or more encodes every host itself,
and a snapshot whose namespaces all do so makes no pass from nowhere.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from meshpilot.model.push_context import PushContext
from meshpilot.model.service import Service
from meshpilot.networking import vhosts
from meshpilot.networking.vhosts_py import kube_domain, named_namespace
from meshpilot.networking.wire_py import read_varint

#: A namespace no hostname names: every service's host gets the domains other namespaces see.
_NOWHERE = "\x00"
#: VirtualHost.domains (field 2, length-delimited).
_DOMAINS_TAG = 2 << 3 | 2
#: A namespace shares the hosts from nowhere while its own services are fewer than this share of all
#: (never when there are none).
SHARE_BELOW = 0.5


def _domains(vhost: bytes) -> list[str]:
    """The domains (field 2) of a VirtualHost as the encoder writes it (length-delimited fields and
    varints only: a fixed-width field would be misread). Tags and lengths are read inline while they
    fit in a byte, as they nearly always do."""
    out: list[str] = []
    pos, end = 0, len(vhost)
    while pos < end:
        tag = vhost[pos]
        if tag & 0x80:
            tag, pos = read_varint(vhost, pos)
        else:
            pos += 1
        if tag & 7 != 2:
            _, pos = read_varint(vhost, pos)
            continue
        length = vhost[pos]
        if length & 0x80:
            length, pos = read_varint(vhost, pos)
        else:
            pos += 1
        if tag == _DOMAINS_TAG:
            out.append(vhost[pos : pos + length].decode())
        pos += length
    return out


@dataclass(frozen=True, slots=True)
class _Neutral:
    """The default hosts as seen from no namespace, and what a namespace needs to make them its own."""

    #: Held so that no other object takes its id (the memo's key) while this lives.
    services: dict[str, Service]
    template: bytes
    hosts: list[tuple[str, bytes]]
    position: dict[str, int]
    #: Every domain some host took (lowercased, as the encoder records them).
    taken: frozenset[str]
    #: Services by the namespace their hostname names, in the order they are encoded.
    by_namespace: dict[str, list[Service]]
    #: Per such namespace, the domains its services' hosts took, and how many hosts they have.
    kept_by_namespace: dict[str, frozenset[str]]
    hosts_by_namespace: dict[str, int]


def default_hosts(
    push: PushContext,
    services: dict[str, Service],
    port: int,
    proxy_domain: str,
    http_protocols: Any,
    covered: set[str],
    known: set[str],
    seen_names: set[str],
    seen_domains: set[str],
    template: bytes,
) -> list[tuple[str, bytes]]:
    """``vhosts.default_virtual_hosts``'s answer for ``services`` (by lowercased hostname, as
    ``services_on_port`` makes them) in any order, shared with the other namespaces of the snapshot
    where it can be (module docstring). Namespaces share only when they pass the same ``services``
    object (``route._services_on_port``, per snapshot and sequence of imported services). Unlike
    the encoder, it leaves ``seen_names`` and ``seen_domains`` as they were when it shares."""

    def alone() -> list[tuple[str, bytes]]:
        return vhosts.default_virtual_hosts(
            services.values(),
            port,
            proxy_domain,
            http_protocols,
            covered,
            known,
            seen_names,
            seen_domains,
            template,
        )

    split = kube_domain(proxy_domain) if push.share_outputs else None
    if split is None:
        return alone()
    namespace, suffix = split
    # Hostnames ending in ``.<namespace>`` and the suffix (``.svc.cluster.local``): the count is rough
    # (a few such names belong to another namespace by ``named_namespace``, and some get no default
    # host), but it only chooses the cheaper of two ways to the same answer. No services: alone.
    tail = f".{namespace}{suffix}"
    if sum(1 for hostname in services if hostname.endswith(tail)) >= SHARE_BELOW * len(services):
        return alone()
    names_before = frozenset(seen_names)
    # Bare names are the proxy's own (its VirtualServices' hosts by short name, or a host with no dot,
    # the same everywhere): left out of the pass from nowhere, so namespaces share it.
    shared_seeds = frozenset(d for d in seen_domains if "." in d)
    own_seeds = seen_domains - shared_seeds
    key = ("route-default-hosts", id(services), port, suffix, frozenset(covered), names_before, shared_seeds)
    neutral: _Neutral = push.memoized(
        key,
        lambda: _neutral(
            services, port, suffix, http_protocols, covered, known, names_before, shared_seeds, template
        ),
    )
    # A hostname naming the neutral namespace itself got its short names in the neutral pass.
    if neutral.services is not services or neutral.template != template or _NOWHERE in neutral.by_namespace:
        return alone()
    if any(seed in neutral.taken for seed in own_seeds):
        return alone()  # a default host took a name this namespace's VirtualServices hold
    own = neutral.by_namespace.get(namespace, ())
    for svc in own:
        hostname = svc.hostname
        if hostname in covered:
            continue  # a VirtualService's host: no default host, whatever its names meet
        # The encoder records domains lowercased and compares them with ``known`` as written.
        if not hostname.isascii() or hostname != hostname.lower():
            return alone()
        added = set(vhosts.alt_hosts(hostname, proxy_domain)) - set(
            vhosts.alt_hosts(hostname, _NOWHERE + suffix)
        )
        if any(name in neutral.taken or name in known for name in added | {"*." + a for a in added}):
            return alone()
    # The own services' hosts again, in their order, with every domain other hosts took (and the
    # VirtualServices hold) already taken: they keep what they kept seen from nowhere, and the names
    # only this namespace gives them.
    taken = set(neutral.taken - neutral.kept_by_namespace.get(namespace, frozenset()))
    taken |= own_seeds
    mine = vhosts.default_virtual_hosts(
        own, port, proxy_domain, http_protocols, covered, known, set(names_before), taken, template
    )
    out = list(neutral.hosts)
    replaced = 0
    for name, vhost in mine:
        at = neutral.position.get(name)
        if at is None:
            out.append((name, vhost))
        else:
            out[at] = (name, vhost)
            replaced += 1
    # Each host the pass from nowhere made comes back (its names only grow); if one did not, the
    # reasoning above missed a case, and the namespace's own encoding is the answer.
    if replaced != neutral.hosts_by_namespace.get(namespace, 0):
        return alone()
    return out


def _neutral(
    services: dict[str, Service],
    port: int,
    suffix: str,
    http_protocols: Any,
    covered: set[str],
    known: set[str],
    seen_names: frozenset[str],
    seen_domains: frozenset[str],
    template: bytes,
) -> _Neutral:
    taken = set(seen_domains)
    hosts = vhosts.default_virtual_hosts(
        services.values(),
        port,
        _NOWHERE + suffix,
        http_protocols,
        covered,
        known,
        set(seen_names),
        taken,
        template,
    )
    by_namespace: dict[str, list[Service]] = defaultdict(list)
    for svc in services.values():
        named = named_namespace(svc.hostname, suffix)
        if named is not None:
            by_namespace[named].append(svc)
    position = {name: i for i, (name, _) in enumerate(hosts)}
    kept: dict[str, set[str]] = defaultdict(set)
    counts: dict[str, int] = defaultdict(int)
    for svc_namespace, members in by_namespace.items():
        for svc in members:
            at = position.get(f"{svc.hostname}:{port}")
            if at is not None:
                # Lowercased, as ``taken`` holds them: an address is kept as it was written.
                kept[svc_namespace].update(domain.lower() for domain in _domains(hosts[at][1]))
                counts[svc_namespace] += 1
    return _Neutral(
        services,
        template,
        hosts,
        position,
        frozenset(taken),
        dict(by_namespace),
        {ns: frozenset(found) for ns, found in kept.items()},
        dict(counts),
    )
