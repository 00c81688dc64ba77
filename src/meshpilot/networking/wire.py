"""Wire encoding of xDS responses, ClusterLoadAssignments and Clusters: the compiled module or its twin.

See ``wire_py`` for the contract. ``IMPLEMENTATION`` says which loaded ("c" or "py").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshpilot._ext import load

__all__ = [
    "CLUSTER_TLS_ALWAYS",
    "CLUSTER_TLS_AUTO",
    "CLUSTER_TLS_NONE",
    "IMPLEMENTATION",
    "NO_TLS_MODE",
    "TLS_ISTIO_MUTUAL",
    "any_bytes",
    "cluster_load_assignment",
    "cluster_metadata",
    "discovery_response",
    "lb_endpoint",
    "locality_groups",
    "outbound_cluster",
    "select",
]

if TYPE_CHECKING:
    from meshpilot.networking.wire_py import (
        CLUSTER_TLS_ALWAYS,
        CLUSTER_TLS_AUTO,
        CLUSTER_TLS_NONE,
        NO_TLS_MODE,
        TLS_ISTIO_MUTUAL,
        any_bytes,
        cluster_load_assignment,
        cluster_metadata,
        discovery_response,
        lb_endpoint,
        locality_groups,
        outbound_cluster,
        select,
    )

    IMPLEMENTATION = "py"
else:
    _module, IMPLEMENTATION = load("meshpilot._ext.wire", "meshpilot.networking.wire_py")
    globals().update({name: getattr(_module, name) for name in __all__ if name != "IMPLEMENTATION"})
