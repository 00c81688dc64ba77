"""CLUSTER patches: REMOVE and MERGE on generated clusters, ADD of new ones (istiod's cluster_patch.go).

A cluster matches by ``name`` alone when the match names one; else by ``service``, ``subset`` and
``portNumber`` read from its name (``outbound|PORT|SUBSET|HOST``). Inbound clusters carry no host:
they match the hosts of the services the proxy serves on that port. A MERGE whose value holds a
``transport_socket`` merges only the socket, as istiod does: into the socket of the same name (its
typed config merged), else replacing it; on a cluster with ``transport_socket_matches`` and none of
that name, the patch does nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from meshpilot.networking.envoyfilter.merge import MergeError, merge_any
from meshpilot.networking.envoyfilter.merge import merge as merge_value
from meshpilot.networking.envoyfilter.patches import ApplyTo, Context, Operation, Patch, PatchSet, is_merge
from meshpilot.networking.envoyfilter.problems import patch_failed
from meshpilot.networking.names import parse_cluster

_CLUSTER = ApplyTo.CLUSTER


def name_matches(name: str, patch: Patch, hosts: Sequence[str] = ()) -> bool:
    """Whether a cluster of this name matches the patch's ``cluster`` match (istiod reads no more)."""
    if not patch.match.HasField("cluster"):
        return True
    wanted = patch.match.cluster
    if wanted.name:
        return bool(wanted.name == name)
    direction, port, subset, host = parse_cluster(name) or ("", 0, "", "")
    candidates = hosts if direction == "inbound" and hosts else (host,)
    if wanted.subset and wanted.subset != subset:
        return False
    if wanted.service and wanted.service not in candidates:
        return False
    return not (wanted.port_number and wanted.port_number != port)


def touches(name: str, patches: PatchSet, context: int, hosts: Sequence[str] = ()) -> bool:
    """Whether some REMOVE or MERGE patch applies to the cluster ``name`` (only those are parsed)."""
    return any(
        (patch.operation == Operation.REMOVE or is_merge(patch.operation))
        and patch.matches_context(context)
        and name_matches(name, patch, hosts)
        for patch in patches[_CLUSTER]
    )


def patch_cluster(cluster: Any, patches: PatchSet, context: int, hosts: Sequence[str] = ()) -> Any | None:
    """``cluster`` with the patches applied in place; None when a patch removes it."""
    for patch in patches[_CLUSTER]:
        if not patch.matches_context(context) or not name_matches(cluster.name, patch, hosts):
            continue
        if patch.operation == Operation.REMOVE:
            return None
        if not is_merge(patch.operation):
            continue
        try:
            if not _merge_transport_socket(cluster, patch.value):
                merge_value(cluster, patch.value, patch.operation == Operation.MERGE_AND_REPLACE_LIST)
        except MergeError as err:
            patch_failed(patch.filter_name, f"CLUSTER MERGE on {cluster.name}: {err}")
    return cluster


def _merge_transport_socket(cluster: Any, value: Any) -> bool:
    """Merge the value's transport socket; False when it has none (merge the whole value)."""
    if not value.HasField("transport_socket"):
        return False
    socket = value.transport_socket
    target = None
    if len(cluster.transport_socket_matches) > 0:
        for match in cluster.transport_socket_matches:
            if match.HasField("transport_socket") and match.transport_socket.name == socket.name:
                target = match.transport_socket
                break
        if target is None:
            # A transport_socket beside transport_socket_matches would be invalid: istiod drops the patch.
            return True
    elif cluster.HasField("transport_socket") and cluster.transport_socket.name == socket.name:
        target = cluster.transport_socket
    if target is None:
        cluster.transport_socket.CopyFrom(socket)
    elif target.HasField("typed_config") and socket.HasField("typed_config"):
        target.typed_config.CopyFrom(merge_any(target.typed_config, socket.typed_config))
    return True


def added_clusters(patches: PatchSet, context: int) -> list[Any]:
    """The clusters ADD patches insert for ``context``; one without a context only on the outbound
    side and on gateways."""
    out = []
    for patch in patches[_CLUSTER]:
        if patch.operation != Operation.ADD or not patch.matches_context(context):
            continue
        if patch.context == Context.ANY and context not in (Context.SIDECAR_OUTBOUND, Context.GATEWAY):
            continue
        out.append(patch.copy_value())
    return out
