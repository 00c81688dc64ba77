"""The EndpointIndex: selects the compiled module or its twin (see ``endpoint_index_py``).

``IMPLEMENTATION`` says which loaded ("c" or "py").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshpilot._ext import NO_EXTENSIONS
from meshpilot.model.endpoint_shards import EndpointShards, PushType, ShardKey

if TYPE_CHECKING or NO_EXTENSIONS:
    from meshpilot.model.endpoint_index_py import EndpointIndex

    IMPLEMENTATION = "py"
else:
    try:
        from meshpilot._ext.endpoint_index import EndpointIndex

        IMPLEMENTATION = "c"
    except ImportError:  # not built: the twin has the same behaviour
        from meshpilot.model.endpoint_index_py import EndpointIndex

        IMPLEMENTATION = "py"

__all__ = ["IMPLEMENTATION", "EndpointIndex", "EndpointShards", "PushType", "ShardKey"]
