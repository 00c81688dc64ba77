"""Locality load balancing: EDS priorities and weights relative to the calling proxy.

istiod rewrites a cluster's ClusterLoadAssignment per calling proxy when a
locality load balancer setting applies (the DestinationRule's, else the
mesh's): ``distribute`` replaces locality weights, and failover (only with
outlier detection, else Envoy never notices a locality is down) gives every
locality group a priority from how close it is to the proxy, or from
``failoverPriority`` labels. Groups here are plain data so both the protobuf
reference builder and the wire encoder render the same result.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from meshpilot._proto.istio.networking.v1alpha3 import destination_rule_pb2
from meshpilot.model import labels as wk
from meshpilot.model.endpoint import Endpoint
from meshpilot.model.service import PREFER_CLOSE, Service
from meshpilot.networking.traffic_policy import ClusterPolicy

_MAX_UINT32 = 0xFFFFFFFF
#: ``failoverPriority`` entries may pin the value to compare: ``label=value``.
_OVERRIDE_SEPARATOR = "="
#: What ``trafficDistribution: PreferClose`` means: same network, then region, zone, subzone.
PREFER_CLOSE_LABELS = (wk.NETWORK, wk.REGION, wk.ZONE, wk.SUBZONE)
_PREFER_CLOSE_SETTING = destination_rule_pb2.LocalityLoadBalancerSetting(
    failover_priority=PREFER_CLOSE_LABELS
)
_PREFER_CLOSE_SETTING.enabled.value = True


@dataclass(frozen=True, slots=True)
class LocalityGroup:
    """One LocalityLbEndpoints: its locality, endpoints, weight and priority."""

    label: str
    endpoints: tuple[Endpoint, ...]
    weight: int
    priority: int = 0


def groups_by_locality(endpoints: Sequence[Endpoint]) -> list[LocalityGroup]:
    """One group per locality in sorted order, weighted by the sum of its endpoints' weights."""
    by_label: dict[str, list[Endpoint]] = {}
    for ep in endpoints:
        by_label.setdefault(ep.locality.label, []).append(ep)
    return [
        LocalityGroup(label, tuple(eps), min(_MAX_UINT32, sum(ep.weight or 1 for ep in eps)))
        for label, eps in sorted(by_label.items())
    ]


def prefers_close(svc: Service) -> bool:
    """Whether the Service asks for close endpoints itself (``trafficDistribution: PreferClose``)."""
    return svc.traffic_distribution == PREFER_CLOSE


def effective_setting(
    mesh_setting: Any | None, rule_lb: Any | None, svc: Service | None = None
) -> tuple[Any | None, bool]:
    """The locality setting in force, and whether failover is forced (istiod's GetLocalityLbSetting).

    The rule's setting wins (``enabled: false`` in it turns locality load
    balancing off); else a Service with ``trafficDistribution: PreferClose``
    prefers its caller's network, region, zone and subzone, with failover on
    even without outlier detection; else the mesh's, unless it is disabled.
    """
    if rule_lb is not None and rule_lb.HasField("locality_lb_setting"):
        setting = rule_lb.locality_lb_setting
        if setting.HasField("enabled") and not setting.enabled.value:
            return None, False
        return setting, False
    if svc is not None and prefers_close(svc):
        return _PREFER_CLOSE_SETTING, True
    if mesh_setting is None:
        return None, False
    if mesh_setting.HasField("enabled") and not mesh_setting.enabled.value:
        return None, False
    return mesh_setting, False


@dataclass(frozen=True, slots=True)
class ClusterLocality:
    """The locality load balancing a cluster follows, the same for its CDS and EDS sides."""

    #: The setting in force (effective_setting), None when locality load balancing is off.
    setting: Any | None
    #: Failover without outlier detection (a PreferClose Service).
    forced: bool
    #: Failover on: forced, or the cluster's policy has outlier detection (istiod's rule).
    failover: bool


def for_cluster(mesh: Any, policy: ClusterPolicy, svc: Service) -> ClusterLocality:
    """The locality load balancing of a cluster of ``svc`` built with ``policy`` under ``mesh``."""
    mesh_setting = mesh.locality_lb_setting if mesh.HasField("locality_lb_setting") else None
    setting, forced = effective_setting(mesh_setting, policy.load_balancer, svc)
    return ClusterLocality(setting, forced, forced or policy.outlier_detection is not None)


def _split(label: str) -> tuple[str, str, str]:
    parts = label.split("/", 2) if label else []
    parts += [""] * (3 - len(parts))
    return parts[0], parts[1], parts[2]


def locality_match(locality: str, rule: str) -> bool:
    """Whether ``locality`` falls under a rule locality ``region[/zone[/subzone]]`` (``*`` matches all)."""
    region, zone, subzone = _split(locality)
    rule_region, rule_zone, rule_subzone = _split(rule)
    return (
        (rule_region == "*" or rule_region == region)
        and (rule_zone in ("*", "") or rule_zone == zone)
        and (rule_subzone in ("*", "") or rule_subzone == subzone)
    )


def lb_priority(proxy: str, endpoints: str) -> int:
    """0 same subzone, 1 same zone, 2 same region, 3 elsewhere (istiod's LbPriority)."""
    p, e = _split(proxy), _split(endpoints)
    if p[0] != e[0]:
        return 3
    if p[1] != e[1]:
        return 2
    return 0 if p[2] == e[2] else 1


def apply(
    groups: list[LocalityGroup],
    setting: Any,
    proxy_locality: str,
    proxy_labels: Mapping[str, str],
    enable_failover: bool,
) -> list[LocalityGroup]:
    """The groups as the calling proxy must see them (istiod's ApplyLocalityLoadBalancer).

    ``distribute`` wins over failover; failover applies only when enabled (outlier detection set).
    """
    if setting.distribute:
        return _distribute(groups, setting.distribute, proxy_locality)
    if not enable_failover:
        return groups
    if setting.failover_priority:
        groups = _failover_priorities(groups, proxy_labels, list(setting.failover_priority))
        if setting.failover:
            groups = _failover(groups, proxy_locality, setting.failover)
        return groups
    return _failover(groups, proxy_locality, setting.failover)


def _distribute(
    groups: list[LocalityGroup], distribute: Sequence[Any], proxy_locality: str
) -> list[LocalityGroup]:
    """The first ``from`` matching the proxy decides each locality's share; others get no endpoints."""
    for entry in distribute:
        if not locality_match(proxy_locality, getattr(entry, "from")):
            continue
        out = list(groups)
        unmatched = set(range(len(groups)))
        # Rule localities in sorted order: validation forbids overlapping ones, so order only fixes ties.
        for rule_locality in sorted(entry.to):
            share = entry.to[rule_locality]
            matched = [i for i in sorted(unmatched) if locality_match(groups[i].label, rule_locality)]
            unmatched.difference_update(matched)
            total = sum(groups[i].weight for i in matched)
            for i in matched:
                # A wildcard may match several localities: the share is split by their own weights.
                weight = groups[i].weight * share / total if total else 0
                if weight > 0:
                    out[i] = replace(out[i], weight=min(_MAX_UINT32, math.ceil(weight)))
        for i in unmatched:
            out[i] = replace(out[i], endpoints=())
        return out
    return groups


def _failover(
    groups: list[LocalityGroup], proxy_locality: str, failover: Sequence[Any]
) -> list[LocalityGroup]:
    """Priorities by closeness; an explicit ``from`` region sends other regions below its ``to``."""
    proxy_region = _split(proxy_locality)[0]
    raw = []
    for group in groups:
        priority = lb_priority(proxy_locality, group.label)
        if priority == 3:
            for entry in failover:
                if getattr(entry, "from") == proxy_region:
                    if _split(group.label)[0] != entry.to:
                        priority = 4
                    break
        # Up to five closeness levels under each label-based priority already assigned.
        raw.append(group.priority * 5 + priority)
    return _compact(groups, raw)


def _compact(groups: list[LocalityGroup], raw: list[int]) -> list[LocalityGroup]:
    """Priorities renumbered 0..N without gaps, keeping their order (Envoy requires no gaps)."""
    rank = {value: i for i, value in enumerate(sorted(set(raw)))}
    return [replace(group, priority=rank[value]) for group, value in zip(groups, raw, strict=True)]


def failover_label_names(entries: Sequence[str]) -> list[str]:
    """The labels ``failoverPriority`` entries compare (``label`` or ``label=override``)."""
    return [name for name, _ in _priority_labels(entries)]


def _priority_labels(entries: Sequence[str]) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    for entry in entries:
        parts = entry.split(_OVERRIDE_SEPARATOR)
        out.append((parts[0], parts[1] if len(parts) == 2 else None))
    return out


def _failover_priorities(
    groups: list[LocalityGroup], proxy_labels: Mapping[str, str], entries: list[str]
) -> list[LocalityGroup]:
    """Each group split by how many leading ``failoverPriority`` labels its endpoints share with the proxy."""
    if not proxy_labels or not groups:
        return groups
    labels = _priority_labels(entries)
    lowest = len(labels)
    split: list[LocalityGroup] = []
    for group in groups:
        by_priority: dict[int, list[Endpoint]] = {}
        for ep in group.endpoints:
            priority = 0
            for j, (name, pinned) in enumerate(labels):
                wanted = pinned if pinned is not None else proxy_labels.get(name, "")
                if ep.labels.get(name, "") != wanted:
                    priority = lowest - j
                    break
            by_priority.setdefault(priority, []).append(ep)
        for priority in sorted(by_priority):
            eps = by_priority[priority]
            weight = min(_MAX_UINT32, sum(ep.weight or 1 for ep in eps))
            split.append(LocalityGroup(group.label, tuple(eps), weight, priority))
    return _compact(split, [g.priority for g in split])


def proxy_view(
    setting: Any | None, enable_failover: bool, proxy_locality: str, proxy_labels: Mapping[str, str]
) -> tuple[object, ...] | None:
    """Exactly what of the proxy the rewritten assignment depends on (part of the EDS cache key).

    None when nothing does, so every proxy shares one entry; otherwise the
    index of the matching ``distribute`` entry, the locality for failover, and
    the proxy's values of the ``failoverPriority`` labels.
    """
    if setting is None:
        return None
    if setting.distribute:
        for i, entry in enumerate(setting.distribute):
            if locality_match(proxy_locality, getattr(entry, "from")):
                return ("distribute", i)
        return None
    if not enable_failover:
        return None
    if setting.failover_priority:
        if not proxy_labels:
            values: tuple[str | None, ...] | None = None
        else:
            values = tuple(
                proxy_labels.get(name, "") if pinned is None else None
                for name, pinned in _priority_labels(list(setting.failover_priority))
            )
        return ("priority", values, proxy_locality if setting.failover else None)
    return ("failover", proxy_locality)
