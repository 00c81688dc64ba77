"""EnvoyFilter patches read once per filter version, and the set of them a proxy takes.

A patch istiod would not apply, or that meshpilot does not apply, is never dropped in silence:
``unapplied`` names every such part of a filter, for the ``meshpilot_unapplied_config`` gauge and
its log line. A patch whose value does not read as its type is left out, as istiod leaves it out.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from meshpilot._proto.istio.networking.v1alpha3 import envoy_filter_pb2
from meshpilot.model.config import Config
from meshpilot.model.envoy_filters import SelectedPatch, version_pattern
from meshpilot.model.proxy import Proxy
from meshpilot.model.push_context import PushContext
from meshpilot.networking.envoyfilter.values import VALUE_TYPES, BadValue, message_from_struct

_EF = envoy_filter_pb2.EnvoyFilter
ApplyTo = _EF.ApplyTo
Operation = _EF.Patch.Operation
Context = _EF.PatchContext

_INSERTS = (Operation.INSERT_BEFORE, Operation.INSERT_AFTER, Operation.INSERT_FIRST)
_MERGES = (Operation.MERGE, Operation.MERGE_AND_REPLACE_LIST)
_FILTER_OPS = frozenset({Operation.ADD, Operation.REMOVE, Operation.MERGE, Operation.REPLACE, *_INSERTS})

#: The operations istiod carries out for each ``applyTo`` (after INSERT_* became ADD where it means
#: nothing else); it passes over any other without a word.
OPERATIONS: dict[int, frozenset[int]] = {
    ApplyTo.CLUSTER: frozenset({Operation.ADD, Operation.REMOVE, *_MERGES}),
    ApplyTo.LISTENER: frozenset({Operation.ADD, Operation.REMOVE, *_MERGES}),
    ApplyTo.FILTER_CHAIN: frozenset({Operation.ADD, Operation.REMOVE, *_MERGES}),
    ApplyTo.LISTENER_FILTER: _FILTER_OPS,
    ApplyTo.NETWORK_FILTER: _FILTER_OPS,
    ApplyTo.HTTP_FILTER: _FILTER_OPS,
    ApplyTo.ROUTE_CONFIGURATION: frozenset(_MERGES),
    ApplyTo.VIRTUAL_HOST: frozenset({Operation.ADD, Operation.REMOVE, Operation.REPLACE, *_MERGES}),
    ApplyTo.HTTP_ROUTE: frozenset({Operation.ADD, Operation.REMOVE, *_MERGES, *_INSERTS}),
}

#: What is not applied, and why, for the kinds of patch meshpilot leaves out.
_NOT_SERVED = {
    ApplyTo.EXTENSION_CONFIG: "EXTENSION_CONFIG patches are not applied: meshpilot serves no ECDS",
    ApplyTo.BOOTSTRAP: "BOOTSTRAP patches are not applied: meshpilot does not patch Envoy's bootstrap",
}


def is_merge(operation: int) -> bool:
    return operation in _MERGES


@dataclass(frozen=True, slots=True, eq=False)
class Patch:
    """One ``configPatches`` entry, ready to apply."""

    #: ``namespace/name`` of its EnvoyFilter: how logs and counts name it.
    filter_name: str
    apply_to: int
    operation: int
    #: An ``EnvoyConfigObjectMatch``; one with context ANY when the patch has none.
    match: Any
    #: The value as the message ``apply_to`` patches (a protobuf Message); None for REMOVE.
    value: Any

    @property
    def context(self) -> int:
        return int(self.match.context)

    def matches_context(self, context: int) -> bool:
        return self.match.context in (Context.ANY, context)

    def copy_value(self) -> Any:
        """A copy of the value to put into generated config (the patch itself is shared)."""
        assert self.value is not None
        out = type(self.value)()
        out.CopyFrom(self.value)
        return out


def _operation(apply_to: int, operation: int) -> int:
    # INSERT_* means ADD wherever there is no list to insert into (istiod's conversion).
    if operation in _INSERTS and apply_to not in (
        ApplyTo.HTTP_FILTER,
        ApplyTo.NETWORK_FILTER,
        ApplyTo.HTTP_ROUTE,
        ApplyTo.LISTENER_FILTER,
    ):
        return Operation.ADD
    return operation


def _problem(spec: Any) -> str | None:
    """Why a patch is not applied, or None when it is (to the proxies it selects)."""
    apply_to, operation = spec.apply_to, spec.patch.operation
    name = f"{ApplyTo.Name(apply_to)} {Operation.Name(operation)}"
    if apply_to in _NOT_SERVED:
        return _NOT_SERVED[apply_to]
    if apply_to not in VALUE_TYPES:
        return f"applyTo {ApplyTo.Name(apply_to)} names nothing to patch"
    if not spec.HasField("patch"):
        return f"{ApplyTo.Name(apply_to)}: no patch"
    if _operation(apply_to, operation) not in OPERATIONS[apply_to]:
        return f"{name} does nothing (istiod ignores it too)"
    match = spec.match
    if match.context == Context.WAYPOINT or match.HasField("waypoint"):
        return f"{name}: waypoint matches are not applied: meshpilot serves no waypoints"
    version = match.proxy.proxy_version
    if version and version_pattern(version) is None:
        shown = version[:80]
        return f"{name}: proxyVersion {shown!r} is not a usable regular expression; it matches no proxy"
    if operation != Operation.REMOVE or spec.patch.HasField("value"):
        try:
            message_from_struct(apply_to, spec.patch.value)
        except BadValue as err:
            return f"{name}: the value is not a valid {VALUE_TYPES[apply_to].DESCRIPTOR.name}: {err}"
    return None


def unapplied(config: Config) -> str | None:
    """What of an EnvoyFilter is not applied to any proxy, or None when all of it may be."""
    problems = []
    if len(config.spec.targetRefs) > 0:
        problems.append(
            "targetRefs attach it to Kubernetes Gateways or waypoints, which meshpilot does not serve"
        )
    for i, spec in enumerate(config.spec.config_patches):
        problem = _problem(spec)
        if problem is not None:
            problems.append(f"patch {i} ({problem})")
    return "; ".join(problems) or None


def convert(config: Config) -> tuple[Patch | None, ...]:
    """The filter's patches by position; None where a patch is not applied (see ``unapplied``)."""
    out: list[Patch | None] = []
    name = f"{config.namespace}/{config.name}"
    for spec in config.spec.config_patches:
        if _problem(spec) is not None:
            out.append(None)
            continue
        value = None
        if spec.patch.HasField("value"):
            value = message_from_struct(spec.apply_to, spec.patch.value)
        match = spec.match if spec.HasField("match") else _EF.EnvoyConfigObjectMatch()
        out.append(Patch(name, spec.apply_to, _operation(spec.apply_to, spec.patch.operation), match, value))
    return tuple(out)


class PatchSet:
    """The patches one proxy takes, by ``applyTo``, each in istiod's order. Shared by every proxy
    that takes the same patches, so it is a memo key by identity."""

    __slots__ = ("_by_apply_to", "filter_names")

    def __init__(self, patches: list[Patch]) -> None:
        by_apply_to: dict[int, list[Patch]] = {}
        for patch in patches:
            by_apply_to.setdefault(patch.apply_to, []).append(patch)
        self._by_apply_to = {k: tuple(v) for k, v in by_apply_to.items()}
        #: The EnvoyFilters (``namespace/name``) the patches come from, in order.
        self.filter_names = tuple(dict.fromkeys(p.filter_name for p in patches))

    def __bool__(self) -> bool:
        return bool(self._by_apply_to)

    def __getitem__(self, apply_to: int) -> tuple[Patch, ...]:
        return self._by_apply_to.get(apply_to, ())

    def has(self, *apply_to: int) -> bool:
        return any(a in self._by_apply_to for a in apply_to)


def _build(push: PushContext, selected: tuple[SelectedPatch, ...]) -> PatchSet:
    patches = []
    for item in selected:
        converted = push.memoized_lasting(
            ("envoyfilter", item.key, item.spec_hash), partial(convert, item.config)
        )
        patch = converted[item.index]
        if patch is not None:
            patches.append(patch)
    return PatchSet(patches)


def patch_set(proxy: Proxy, push: PushContext) -> PatchSet | None:
    """The patches ``proxy`` takes; None (at the cost of two lookups) when it takes none."""
    selected = push.envoy_filters.patches_for(proxy)
    if not selected:
        return None
    found = push.memoized(("envoyfilter-patches", selected), lambda: _build(push, selected))
    return found if found else None
