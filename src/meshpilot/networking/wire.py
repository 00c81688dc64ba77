"""Wire encoding of xDS responses and ClusterLoadAssignments: selects the compiled module or its twin.

See ``wire_py`` for the contract. ``IMPLEMENTATION`` says which loaded ("c" or "py").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshpilot._ext import NO_EXTENSIONS

if TYPE_CHECKING or NO_EXTENSIONS:
    from meshpilot.networking.wire_py import (
        NO_TLS_MODE,
        TLS_ISTIO_MUTUAL,
        any_bytes,
        cluster_load_assignment,
        discovery_response,
        lb_endpoint,
        locality_groups,
        select,
    )

    IMPLEMENTATION = "py"
else:
    try:
        from meshpilot._ext.wire import (
            NO_TLS_MODE,
            TLS_ISTIO_MUTUAL,
            any_bytes,
            cluster_load_assignment,
            discovery_response,
            lb_endpoint,
            locality_groups,
            select,
        )

        IMPLEMENTATION = "c"
    except ImportError:  # not built: the twin has the same behaviour
        from meshpilot.networking.wire_py import (
            NO_TLS_MODE,
            TLS_ISTIO_MUTUAL,
            any_bytes,
            cluster_load_assignment,
            discovery_response,
            lb_endpoint,
            locality_groups,
            select,
        )

        IMPLEMENTATION = "py"

__all__ = [
    "IMPLEMENTATION",
    "NO_TLS_MODE",
    "TLS_ISTIO_MUTUAL",
    "any_bytes",
    "cluster_load_assignment",
    "discovery_response",
    "lb_endpoint",
    "locality_groups",
    "select",
]
