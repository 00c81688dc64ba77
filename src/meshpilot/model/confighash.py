"""Stable 64-bit config hashes: selects the compiled module or its twin.

See ``confighash_py`` for the contract. ``IMPLEMENTATION`` says which one
loaded ("c" or "py"), so a test can fail when the compiled module was expected.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshpilot._ext import NO_EXTENSIONS

if TYPE_CHECKING or NO_EXTENSIONS:
    from meshpilot.model.confighash_py import encode_value, hash_bytes, hash_value

    IMPLEMENTATION = "py"
else:
    try:
        from meshpilot._ext.confighash import encode_value, hash_bytes, hash_value

        IMPLEMENTATION = "c"
    except ImportError:  # not built: the twin has the same behaviour
        from meshpilot.model.confighash_py import encode_value, hash_bytes, hash_value

        IMPLEMENTATION = "py"

__all__ = ["IMPLEMENTATION", "encode_value", "hash_bytes", "hash_value"]
