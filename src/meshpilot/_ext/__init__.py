"""Compiled hot paths, built from ``ext/`` by setup.py.

Never import these modules directly: each has a selector module next to its
pure-Python twin (for example ``meshpilot.model.confighash``), which picks the
compiled module unless ``MESHPILOT_NO_EXTENSIONS`` is set.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

#: True when the pure-Python twins are selected for every hot path.
NO_EXTENSIONS: bool = os.environ.get("MESHPILOT_NO_EXTENSIONS", "") not in ("", "0")

#: Selector modules of the accelerated hot paths; each has ``IMPLEMENTATION`` ("c" or "py").
SELECTORS = (
    "meshpilot.model.confighash",
    "meshpilot.model.endpoint_index",
    "meshpilot.networking.vhosts",
    "meshpilot.networking.wire",
    "meshpilot.xds.request_head",
)


def load(compiled: str, twin: str) -> tuple[ModuleType, str]:
    """The compiled module and "c", else the twin and "py" (extensions off or not built)."""
    if not NO_EXTENSIONS:
        try:
            return importlib.import_module(compiled), "c"
        except ImportError:  # not built: the twin has the same behaviour
            pass
    return importlib.import_module(twin), "py"
