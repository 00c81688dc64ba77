"""LISTENER, LISTENER_FILTER, FILTER_CHAIN, NETWORK_FILTER and HTTP_FILTER patches, in istiod's order
(listener_patch.go).

Per listener: LISTENER MERGE and REMOVE, then its listener filters, then each filter chain (the
default chain last): FILTER_CHAIN MERGE and REMOVE, the NETWORK_FILTER list operations, then per
network filter its MERGE and, for an HTTP connection manager, the HTTP_FILTER list operations and
MERGEs. FILTER_CHAIN ADDs follow a listener's chains; LISTENER ADDs follow every listener.

On ``virtualInbound`` and ``virtualOutbound`` a ``portNumber`` below LISTENER selects the filter
chains of that destination port instead of the listener. A chain left without filters is dropped,
as istiod drops it.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)

from meshpilot.networking.envoyfilter import list_ops
from meshpilot.networking.envoyfilter.merge import MergeError, merge_any
from meshpilot.networking.envoyfilter.merge import merge as merge_value
from meshpilot.networking.envoyfilter.patches import ApplyTo, Context, Operation, Patch, PatchSet, is_merge
from meshpilot.networking.envoyfilter.problems import patch_failed
from meshpilot.networking.envoyfilter.routes import ROUTE_KINDS, patch_route_configuration
from meshpilot.networking.filters import HCM
from meshpilot.networking.protobuf import pack

_VIRTUAL = frozenset({"virtualInbound", "virtualOutbound"})
_HCM_TYPE = hcm_pb2.HttpConnectionManager.DESCRIPTOR.full_name
#: Every patch kind that acts on or below a listener.
LISTENER_KINDS = (
    ApplyTo.LISTENER,
    ApplyTo.LISTENER_FILTER,
    ApplyTo.FILTER_CHAIN,
    ApplyTo.NETWORK_FILTER,
    ApplyTo.HTTP_FILTER,
)


# -- matching ------------------------------------------------------------------------------------


def listener_matches(listener: Any, patch: Patch) -> bool:
    if not patch.match.HasField("listener"):
        return True
    wanted = patch.match.listener
    if wanted.name and wanted.name != listener.name:
        return False
    if patch.apply_to != ApplyTo.LISTENER and listener.name in _VIRTUAL:
        # The port is that of the filter chains (filter_chain_matches).
        return True
    if wanted.port_number:
        address = listener.address
        if not address.HasField("socket_address") or address.socket_address.port_value != wanted.port_number:
            return False
    return True


def filter_chain_matches(listener: Any, chain: Any, patch: Patch) -> bool:
    """Whether ``chain`` of ``listener`` (which matches already) matches the patch."""
    if not patch.match.HasField("listener"):
        return True
    wanted = patch.match.listener
    match = chain.filter_chain_match
    port = wanted.port_number
    if listener.name in _VIRTUAL and port and match.destination_port.value != port:
        return False
    if not wanted.HasField("filter_chain"):
        return True
    spec = wanted.filter_chain
    if spec.name and spec.name != chain.name:
        return False
    if spec.sni and spec.sni not in match.server_names:
        return False
    if spec.transport_protocol and match.transport_protocol != spec.transport_protocol:
        return False
    if spec.application_protocols and any(
        p not in match.application_protocols for p in spec.application_protocols.split(",")
    ):
        return False
    return not (
        spec.destination_port
        and (not match.HasField("destination_port") or match.destination_port.value != spec.destination_port)
    )


def _has_network_filter_match(patch: Patch) -> bool:
    match = patch.match
    return bool(
        match.HasField("listener")
        and match.listener.HasField("filter_chain")
        and match.listener.filter_chain.HasField("filter")
    )


def _network_filter_matches(filter_: Any, *, patch: Patch) -> bool:
    if not _has_network_filter_match(patch):
        return True
    return bool(patch.match.listener.filter_chain.filter.name == filter_.name)


def _has_http_filter_match(patch: Patch) -> bool:
    if not _has_network_filter_match(patch):
        return False
    return bool(patch.match.listener.filter_chain.filter.HasField("sub_filter"))


def _http_filter_matches(filter_: Any, *, patch: Patch) -> bool:
    if not _has_http_filter_match(patch):
        return True
    return bool(patch.match.listener.filter_chain.filter.sub_filter.name == filter_.name)


def _has_listener_filter_match(patch: Patch) -> bool:
    return bool(patch.match.HasField("listener") and patch.match.listener.listener_filter)


def _listener_filter_matches(filter_: Any, *, patch: Patch) -> bool:
    if not _has_listener_filter_match(patch):
        return True
    return bool(patch.match.listener.listener_filter == filter_.name)


def may_touch(name: str, patches: PatchSet, context: int) -> bool:
    """Whether some patch may act on the listener ``name`` (one that cannot is not parsed)."""
    for kind in LISTENER_KINDS:
        for patch in patches[kind]:
            if not patch.matches_context(context):
                continue
            match = patch.match
            if not (match.HasField("listener") and match.listener.name and match.listener.name != name):
                return True
    return False


# -- listeners -----------------------------------------------------------------------------------


def patch_listener(listener: Any, patches: PatchSet, context: int) -> bool:
    """Apply every patch below LISTENER ADD to ``listener`` in place; True when one removes it."""
    for patch in patches[ApplyTo.LISTENER]:
        if not patch.matches_context(context) or not listener_matches(listener, patch):
            continue
        if patch.operation == Operation.REMOVE:
            return True
        if is_merge(patch.operation):
            merge_value(listener, patch.value, patch.operation == Operation.MERGE_AND_REPLACE_LIST)
    _patch_listener_filters(listener, patches, context)
    _patch_filter_chains(listener, patches, context)
    return False


def added_listeners(patches: PatchSet, context: int) -> list[Any]:
    """The listeners ADD patches insert; one without a context only on the outbound side and on gateways."""
    out = []
    for patch in patches[ApplyTo.LISTENER]:
        if patch.operation != Operation.ADD or not patch.matches_context(context):
            continue
        if patch.context == Context.ANY and context not in (Context.SIDECAR_OUTBOUND, Context.GATEWAY):
            continue
        out.append(patch.copy_value())
    return out


def _patch_listener_filters(listener: Any, patches: PatchSet, context: int) -> None:
    for patch in patches[ApplyTo.LISTENER_FILTER]:
        if not patch.matches_context(context) or not listener_matches(listener, patch):
            continue
        has_match = _has_listener_filter_match(patch)
        if patch.operation == Operation.MERGE:
            if has_match:
                for filter_ in listener.listener_filters:
                    if _listener_filter_matches(filter_, patch=patch):
                        _merge_typed_config(filter_, patch, rename=False)
            continue
        items = list_ops.apply(
            list(listener.listener_filters),
            patch,
            has_match,
            partial(_listener_filter_matches, patch=patch),
        )
        if items is not None:
            list_ops.replace_all(listener.listener_filters, items)


# -- filter chains -------------------------------------------------------------------------------


def _patch_filter_chains(listener: Any, patches: PatchSet, context: int) -> None:
    for chain in listener.filter_chains:
        if len(chain.filters) > 0:
            _patch_filter_chain(listener, chain, patches, context)
    if listener.HasField("default_filter_chain") and len(listener.default_filter_chain.filters) > 0:
        _patch_filter_chain(listener, listener.default_filter_chain, patches, context)
        if len(listener.default_filter_chain.filters) == 0:
            listener.ClearField("default_filter_chain")
    for patch in patches[ApplyTo.FILTER_CHAIN]:
        if (
            patch.operation == Operation.ADD
            and patch.matches_context(context)
            and listener_matches(listener, patch)
        ):
            listener.filter_chains.append(patch.copy_value())
    chains = list(listener.filter_chains)
    if any(len(chain.filters) == 0 for chain in chains):
        list_ops.replace_all(listener.filter_chains, [c for c in chains if len(c.filters) > 0])


def _patch_filter_chain(listener: Any, chain: Any, patches: PatchSet, context: int) -> None:
    for patch in patches[ApplyTo.FILTER_CHAIN]:
        if (
            not patch.matches_context(context)
            or not listener_matches(listener, patch)
            or not filter_chain_matches(listener, chain, patch)
        ):
            continue
        if patch.operation == Operation.REMOVE:
            del chain.filters[:]  # dropped with the other empty chains
            return
        if is_merge(patch.operation):
            try:
                if not _merge_transport_socket(chain, patch.value):
                    merge_value(chain, patch.value, patch.operation == Operation.MERGE_AND_REPLACE_LIST)
            except MergeError as err:
                patch_failed(patch.filter_name, f"FILTER_CHAIN MERGE on {listener.name}: {err}")
    _patch_network_filters(listener, chain, patches, context)


def _merge_transport_socket(chain: Any, value: Any) -> bool:
    """Merge into the chain's transport socket of the same name; False to merge the whole value."""
    if not value.HasField("transport_socket") or not chain.HasField("transport_socket"):
        return False
    socket = value.transport_socket
    if chain.transport_socket.name != socket.name:
        return False
    if chain.transport_socket.HasField("typed_config") and socket.HasField("typed_config"):
        chain.transport_socket.typed_config.CopyFrom(
            merge_any(chain.transport_socket.typed_config, socket.typed_config)
        )
    return True


# -- network and HTTP filters --------------------------------------------------------------------


def _chain_patches(listener: Any, chain: Any, patches: tuple[Patch, ...], context: int) -> list[Patch]:
    return [
        p
        for p in patches
        if p.matches_context(context)
        and listener_matches(listener, p)
        and filter_chain_matches(listener, chain, p)
    ]


def _patch_network_filters(listener: Any, chain: Any, patches: PatchSet, context: int) -> None:
    network = _chain_patches(listener, chain, patches[ApplyTo.NETWORK_FILTER], context)
    for patch in network:
        if patch.operation == Operation.MERGE:
            continue
        items = list_ops.apply(
            list(chain.filters),
            patch,
            _has_network_filter_match(patch),
            partial(_network_filter_matches, patch=patch),
        )
        if items is not None:
            list_ops.replace_all(chain.filters, items)
    http = _chain_patches(listener, chain, patches[ApplyTo.HTTP_FILTER], context)
    for filter_ in chain.filters:
        for patch in network:
            if patch.operation == Operation.MERGE and _network_filter_matches(filter_, patch=patch):
                _merge_typed_config(filter_, patch, rename=True)
        if filter_.name == HCM:
            _patch_http_filters(
                listener, filter_, [p for p in http if _network_filter_matches(filter_, patch=p)]
            )


def _patch_http_filters(listener: Any, filter_: Any, patches: list[Patch]) -> None:
    if not patches or filter_.typed_config.TypeName() != _HCM_TYPE:
        return
    hcm = hcm_pb2.HttpConnectionManager()
    filter_.typed_config.Unpack(hcm)
    for patch in patches:
        if patch.operation == Operation.MERGE:
            continue
        items = list_ops.apply(
            list(hcm.http_filters),
            patch,
            _has_http_filter_match(patch),
            partial(_http_filter_matches, patch=patch),
        )
        if items is not None:
            list_ops.replace_all(hcm.http_filters, items)
    for http_filter in hcm.http_filters:
        for patch in patches:
            if patch.operation == Operation.MERGE and _http_filter_matches(http_filter, patch=patch):
                _merge_typed_config(http_filter, patch, rename=True)
    filter_.typed_config.CopyFrom(pack(hcm))


def _merge_typed_config(target: Any, patch: Patch, rename: bool) -> None:
    """A filter MERGE: the value's typed config merged into the filter's (same type only); its
    name, if it has one, replaces the filter's. A filter without a typed config is left alone."""
    if not target.HasField("typed_config"):
        return
    value = patch.value
    assert value is not None
    merged = None
    if value.HasField("typed_config"):
        try:
            merged = merge_any(target.typed_config, value.typed_config)
        except MergeError as err:
            patch_failed(patch.filter_name, f"{ApplyTo.Name(patch.apply_to)} MERGE on {target.name}: {err}")
            return
    if rename and value.name:
        target.name = value.name
    if merged is not None:
        target.typed_config.CopyFrom(merged)


# -- route configurations inside listeners ----------------------------------------------------------


def patch_inline_routes(listener: Any, patches: PatchSet, context: int) -> None:
    """Route patches on the route configurations HTTP connection managers carry inline (a sidecar's
    inbound routes, which istiod patches as it builds them, before the listener patches)."""
    if not patches.has(*ROUTE_KINDS):
        return
    chains = list(listener.filter_chains)
    if listener.HasField("default_filter_chain"):
        chains.append(listener.default_filter_chain)
    for chain in chains:
        for filter_ in chain.filters:
            if filter_.name != HCM or filter_.typed_config.TypeName() != _HCM_TYPE:
                continue
            hcm = hcm_pb2.HttpConnectionManager()
            filter_.typed_config.Unpack(hcm)
            if not hcm.HasField("route_config"):
                continue
            patch_route_configuration(hcm.route_config, patches, context)
            filter_.typed_config.CopyFrom(pack(hcm))
