"""Default virtual hosts, wire-encoded: the compiled module or its twin.

See ``vhosts_py`` for the contract. ``IMPLEMENTATION`` says which loaded ("c" or "py").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshpilot._ext import load

__all__ = ["IMPLEMENTATION", "alt_hosts", "default_virtual_hosts", "route_configuration", "services_on_port"]

if TYPE_CHECKING:
    from meshpilot.networking.vhosts_py import (
        alt_hosts,
        default_virtual_hosts,
        route_configuration,
        services_on_port,
    )

    IMPLEMENTATION = "py"
else:
    _module, IMPLEMENTATION = load("meshpilot._ext.vhosts", "meshpilot.networking.vhosts_py")
    globals().update({name: getattr(_module, name) for name in __all__ if name != "IMPLEMENTATION"})
