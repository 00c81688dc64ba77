"""The head of a serialized DiscoveryRequest: the compiled module or its twin.

See ``request_head_py`` for the contract. ``IMPLEMENTATION`` says which loaded ("c" or "py").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshpilot._ext import load

__all__ = ["FLAG_ERROR", "FLAG_FULL_PARSE", "FLAG_NODE", "IMPLEMENTATION", "scan"]

if TYPE_CHECKING:
    from meshpilot.xds.request_head_py import FLAG_ERROR, FLAG_FULL_PARSE, FLAG_NODE, scan

    IMPLEMENTATION = "py"
else:
    _module, IMPLEMENTATION = load("meshpilot._ext.request_head", "meshpilot.xds.request_head_py")
    globals().update({name: getattr(_module, name) for name in __all__ if name != "IMPLEMENTATION"})
