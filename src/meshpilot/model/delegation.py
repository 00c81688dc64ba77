"""Delegate VirtualServices merged into the root VirtualServices that name them.

A VirtualService without hosts is a delegate: it only takes effect through a
root VirtualService whose HTTP route says ``delegate: {name, namespace}``.
Each such root route is replaced by the delegate's routes, each narrowed by
the root route's matches and inheriting what it leaves unset. A delegate
route whose matches conflict with the root's is dropped, as istiod drops it;
a missing or unexported delegate drops only the root route naming it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from typing import Any

from meshpilot.model import visibility
from meshpilot.model.config import Config, ConfigKey
from meshpilot.model.confighash import hash_value
from meshpilot.model.kind import Kind

log = logging.getLogger(__name__)

# HTTPRoute fields a delegate route inherits from the root route when it leaves them unset.
_INHERITED = (
    "rewrite",
    "direct_response",
    "timeout",
    "retries",
    "fault",
    "mirror",
    "mirror_percent",
    "mirror_percentage",
    "cors_policy",
    "headers",
)
_STRING_MATCHES = ("uri", "scheme", "method", "authority")
_MAP_MATCHES = ("headers", "without_headers", "query_params")


@dataclasses.dataclass(frozen=True, slots=True)
class Merged:
    """VirtualServices after delegation, and which delegates each root read."""

    configs: list[Config]
    delegates: dict[ConfigKey, frozenset[ConfigKey]]


def is_delegate(config: Config) -> bool:
    return not config.spec.hosts


def _is_root(config: Config) -> bool:
    return any(http.HasField("delegate") for http in config.spec.http)


def merge_delegates(configs: Iterable[Config], default_export_to: frozenset[str]) -> Merged:
    """Roots with their delegates merged in; delegates themselves are left out."""
    plain: list[Config] = []
    roots: list[Config] = []
    delegates: dict[tuple[str, str], Config] = {}
    for config in configs:
        if is_delegate(config):
            delegates[(config.namespace, config.name)] = config
        elif _is_root(config):
            roots.append(config)
        else:
            plain.append(config)
    read: dict[ConfigKey, frozenset[ConfigKey]] = {}
    for root in roots:
        merged, named = _merge_root(root, delegates, default_export_to)
        read[root.key] = named
        plain.append(merged)
    return Merged(plain, read)


def _merge_root(
    root: Config, delegates: dict[tuple[str, str], Config], default_export_to: frozenset[str]
) -> tuple[Config, frozenset[ConfigKey]]:
    spec = type(root.spec)()
    spec.CopyFrom(root.spec)
    del spec.http[:]
    named: set[ConfigKey] = set()
    used: list[Config] = []
    for route in root.spec.http:
        if not route.HasField("delegate"):
            spec.http.add().CopyFrom(route)
            continue
        namespace = route.delegate.namespace or root.namespace
        named.add(ConfigKey(Kind.VIRTUAL_SERVICE, route.delegate.name, namespace))
        delegate = delegates.get((namespace, route.delegate.name))
        if delegate is None:
            log.warning(
                "delegate virtual service %s/%s of %s/%s not found",
                namespace,
                route.delegate.name,
                root.namespace,
                root.name,
            )
            continue
        export_to = visibility.export_set(delegate.spec.export_to, default_export_to)
        if not visibility.visible_to(export_to, delegate.namespace, root.namespace):
            log.warning(
                "delegate virtual service %s/%s of %s/%s is not exported to %s",
                namespace,
                route.delegate.name,
                root.namespace,
                root.name,
                root.namespace,
            )
            continue
        used.append(delegate)
        for sub in delegate.spec.http:
            merged = _merge_route(route, sub)
            if merged is not None:
                spec.http.add().CopyFrom(merged)
    # The merged spec is what routes are built from: its hash must change when a delegate does.
    spec_hash = hash_value((root.spec_hash, [(str(d.key), d.spec_hash) for d in used]))
    return dataclasses.replace(root, spec=spec, spec_hash=spec_hash), frozenset(named)


def _merge_route(root: Any, delegate: Any) -> Any | None:
    matches = _merge_matches(list(root.match), list(delegate.match))
    if matches is None:
        log.warning("HTTP matches conflict: root route %r, delegate route %r", root.name, delegate.name)
        return None
    out = type(delegate)()
    out.CopyFrom(delegate)
    del out.match[:]
    out.match.extend(matches)
    if root.name:
        out.name = f"{root.name}-{delegate.name}" if delegate.name else root.name
    for field in _INHERITED:
        if not delegate.HasField(field) and root.HasField(field):
            getattr(out, field).CopyFrom(getattr(root, field))
    if not delegate.mirrors:
        out.mirrors.extend(root.mirrors)
    return out


def _merge_matches(root: list[Any], delegate: list[Any]) -> list[Any] | None:
    """Every delegate match narrowed by each root match it fits in; None on a conflict."""
    if not root:
        return delegate
    if not delegate:
        return root
    out: list[Any] = []
    for sub in delegate:
        fitting = [_merge_match(r, sub) for r in root if not _conflicts(r, sub)]
        if not fitting:
            return None
        out.extend(fitting)
    return out


def _merge_match(root: Any, delegate: Any) -> Any:
    out = type(delegate)()
    out.CopyFrom(delegate)
    if root.name:
        out.name = f"{root.name}-{delegate.name}" if delegate.name else root.name
    for field in _STRING_MATCHES:
        if not delegate.HasField(field) and root.HasField(field):
            getattr(out, field).CopyFrom(getattr(root, field))
    for field in (*_MAP_MATCHES, "source_labels"):
        merged = getattr(out, field)
        for key, value in getattr(root, field).items():
            if key not in getattr(delegate, field):
                if field == "source_labels":
                    merged[key] = value
                else:
                    merged[key].CopyFrom(value)
    if not out.port:
        out.port = root.port
    if not out.source_namespace:
        out.source_namespace = root.source_namespace
    if not out.gateways:
        out.gateways.extend(root.gateways)
    if not out.stat_prefix:
        out.stat_prefix = root.stat_prefix
    return out


def _conflicts(root: Any, leaf: Any) -> bool:
    for field in _STRING_MATCHES:
        if _string_conflict(
            getattr(root, field) if root.HasField(field) else None,
            getattr(leaf, field) if leaf.HasField(field) else None,
        ):
            return True
    for field in _MAP_MATCHES:
        root_map = getattr(root, field)
        for key, value in getattr(leaf, field).items():
            if _string_conflict(root_map.get(key), value):
                return True
    if root.ignore_uri_case != leaf.ignore_uri_case:
        return True
    if root.port and leaf.port and root.port != leaf.port:
        return True
    if root.source_namespace and leaf.source_namespace != root.source_namespace:
        return True
    if any(k in root.source_labels and root.source_labels[k] != v for k, v in leaf.source_labels.items()):
        return True
    # Gateways: the root's must be a superset of the leaf's.
    return bool(root.gateways and leaf.gateways and not set(leaf.gateways) <= set(root.gateways))


def _string_conflict(root: Any | None, leaf: Any | None) -> bool:
    """Whether ``leaf`` can match something ``root`` cannot: regexes only pair with nothing."""
    if root is None or leaf is None:
        return False
    root_kind, leaf_kind = root.WhichOneof("match_type"), leaf.WhichOneof("match_type")
    if root_kind == "regex" and root.regex and leaf_kind in ("regex", "prefix", "exact"):
        return bool(getattr(leaf, leaf_kind))
    if leaf_kind == "regex" and leaf.regex and root_kind in ("regex", "prefix", "exact"):
        return bool(getattr(root, root_kind))
    if root_kind == "exact" and root.exact:
        if leaf_kind == "prefix" and leaf.prefix:
            return True
        leaf_exact: str = leaf.exact if leaf_kind == "exact" else ""
        return bool(leaf_exact != root.exact)
    if root_kind == "prefix" and root.prefix:
        if leaf_kind == "prefix" and leaf.prefix:
            return not leaf.prefix.startswith(root.prefix)
        if leaf_kind == "exact" and leaf.exact:
            return not leaf.exact.startswith(root.prefix)
    return True
