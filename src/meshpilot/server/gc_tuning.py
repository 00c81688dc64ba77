"""Garbage-collector settings for a process that holds a large, mostly long-lived model.

With CPython's default thresholds a fleet of 2,000 proxies spent 12% of the
server's CPU in the cyclic collector, and full collections paused the event
loop (and /ready) for up to 0.3 s (measured with bench/; see
docs/benchmarks.md). Payloads are bytes, which the collector does not track;
what it scans over and over are the model's services, endpoints and configs
and the streams' objects, which live long and are freed by reference counting
when replaced. So: young collections every 10,000 allocations instead of 700;
the middle generation collected every 10 of those, which keeps its pauses
near 10-40 ms even while thousands of streams connect (20 let it grow to a
million objects and 0.1 s pauses); full collections only after 100 middle
ones; and everything loaded at start frozen out of the collector's sight.

No full collections of our own: what an aborted stream leaves in a cycle inside
grpc is made small as the stream ends (``DiscoveryServer.serve_stream``), and
collections paced by ended streams, each scanning every proxy's state, held the
interpreter and /ready for up to 0.8 s at a time in reconnect storms
(bench/notes.md).
"""

from __future__ import annotations

import gc
import logging
import os

log = logging.getLogger(__name__)

DEFAULT_THRESHOLDS = (10_000, 10, 100)
ENV = "MESHPILOT_GC_THRESHOLDS"


def configure() -> tuple[int, ...]:
    """Apply ``$MESHPILOT_GC_THRESHOLDS`` ("gen0,gen1,gen2"), else the defaults; returns them."""
    thresholds: tuple[int, ...] = DEFAULT_THRESHOLDS
    raw = os.environ.get(ENV, "")
    if raw:
        try:
            parsed = tuple(int(part) for part in raw.split(","))
        except ValueError:
            parsed = ()
        if not 1 <= len(parsed) <= 3 or any(n < 0 for n in parsed):
            log.warning("ignoring %s=%r: expected up to three non-negative integers", ENV, raw)
        else:
            thresholds = parsed
    gc.set_threshold(*thresholds)
    return thresholds


def freeze_loaded() -> None:
    """Collect once, then exempt every surviving object from later collections."""
    gc.collect()
    gc.freeze()
