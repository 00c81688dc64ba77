"""Whether a proxy holds what was last sent to it, per type: the rule behind ``istioctl proxy-status``.

The xDS view is Envoy's CSDS message (``envoy.service.status.v3.ClientConfig``), one per proxy, as
istiod's ``istio.io/debug/syncz`` sends it: the node's ID and three metadata fields, and per watched
type its status and when it was last sent. The HTTP ``/debug/syncz`` page shows the nonces instead.
"""

from __future__ import annotations

from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.status.v3 import csds_pb2
from google.protobuf import struct_pb2, timestamp_pb2

from meshpilot.xds.connection import Connection, WatchedResource


def config_status(watch: WatchedResource) -> Any:
    """ERROR after a NACK (until the next ACK), NOT_SENT before the first response, SYNCED when the
    last response was acknowledged, STALE while it is not (yet)."""
    if watch.last_error:
        return csds_pb2.ERROR
    if not watch.nonce_sent:
        return csds_pb2.NOT_SENT
    if watch.nonce_acked == watch.nonce_sent:
        return csds_pb2.SYNCED
    return csds_pb2.STALE


def is_proxy(conn: Connection) -> bool:
    """Proxies started by an agent send their ProxyConfig; other clients (istioctl itself, test
    tools) do not, and are left out of the sync status as istiod leaves them out."""
    return "PROXY_CONFIG" in conn.proxy.metadata.raw


def _timestamp(seconds: float) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    if seconds:
        stamp.FromNanoseconds(int(seconds * 1e9))
    return stamp


def client_config(conn: Connection) -> Any:
    """``conn``'s CSDS ClientConfig: per watched type (by type URL) its status and last send."""
    proxy = conn.proxy
    metadata = struct_pb2.Struct()
    fields = {
        "CLUSTER_ID": proxy.metadata.cluster_id,
        "NAMESPACE": proxy.metadata.namespace,
        "ISTIO_VERSION": proxy.metadata.istio_version,
    }
    metadata.update({k: v for k, v in fields.items() if v})
    # The node is named by the third part of its ID (``pod.namespace``), as istiod names it.
    out = csds_pb2.ClientConfig(node=base_pb2.Node(id=proxy.id, metadata=metadata))
    for type_url in sorted(conn.watched):
        watch = conn.watched[type_url]
        entry = out.generic_xds_configs.add(type_url=type_url, config_status=config_status(watch))
        entry.last_updated.CopyFrom(_timestamp(watch.last_sent))
        if watch.last_error:
            entry.error_state.details = watch.last_error
            entry.error_state.last_update_attempt.CopyFrom(_timestamp(watch.last_sent))
    return out
