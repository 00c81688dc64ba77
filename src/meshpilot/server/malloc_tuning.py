"""The C allocator's settings for a server that receives large messages from clients it does not trust.

glibc raises its mmap threshold each time a large block is freed (up to 32 MiB), so after the first
freed megabyte-sized request every later one is carved from the heap or a per-thread arena, where
the long-lived small blocks allocated meanwhile keep the freed space from going back to the system.
Measured with `bench/ads_flood.py` (100,000 hostile requests, some carrying 1 MB node IDs or 70,000
names; docs/reliability.md): the server grew from 101 to 145 MiB with glibc's defaults, and to
116 MiB with the threshold fixed at its initial 128 KiB and two arenas (the main thread's and one
shared by gRPC's threads, which allocate little).

Large blocks are then always mapped and unmapped: gRPC copies every response it is handed into a block
of its size, so each write of more than 128 KiB maps fresh pages and faults them in (127 for a 517 KB
route configuration). In the benchmark's route push that doubled the server's CPU, 1.6 s instead of
jemalloc's 0.8 s (bench/notes.md, "The servers' allocator"). ``MALLOC_ARENA_MAX`` or
``MALLOC_MMAP_THRESHOLD_`` in the environment (glibc's own knobs) leave the choice to the operator.

All of this is glibc's and applies only when glibc's ``malloc`` is the one in use. ``meshpilot
discovery`` normally runs on jemalloc (``server/allocator.py``), whose ``malloc`` ignores these
settings (``mallopt`` would still reach glibc's allocator, which then serves nothing): under it
``configure`` does nothing, and jemalloc's page purging (``MALLOC_CONF``) does what the fixed
threshold did here. With glibc, Python's own objects stay with CPython's small-object allocator:
``PYTHONMALLOC=malloc`` on glibc kept more memory after 10,000 ServiceEntries were added and removed
and made the micro benchmarks 10% slower (docs/reliability.md, "Memory after a large file").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

from meshpilot.server import allocator

log = logging.getLogger(__name__)

# mallopt's parameters (glibc's malloc.h).
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8

MMAP_THRESHOLD = 128 * 1024
ARENA_MAX = 2


def configure() -> bool:
    """Apply the settings above unless the environment sets glibc's own; True if they were applied.

    Call before gRPC starts its threads: arenas that exist stay.
    """
    if "MALLOC_ARENA_MAX" in os.environ or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    if allocator.jemalloc_mapped():
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt): its allocator, its defaults
        return False
    applied = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_ARENA_MAX, ARENA_MAX))
    if not applied:
        log.debug("mallopt refused the allocator settings; glibc's defaults stay")
    return applied
