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
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time

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


class EndedStreams:
    """Full collections paced by streams the server refused after admitting them.

    grpc's asyncio server keeps an abort's exception in a reference cycle with the call's state. The
    stream's own frames are cleared from its traceback as it ends (``DiscoveryServer.serve_stream``),
    so the stream and the requests it read are freed at once; what is left is grpc's part, which may
    be old enough by then that only a full collection frees it. A flood of hostile streams (1 MB node
    IDs, 70,000 names) left that way held twice the server's starting memory (docs/reliability.md).
    Streams refused at admission leave a young cycle, which the young collections free, and a stream
    its client closed leaves none: neither is counted, so a reconnect storm, where the rate limiter
    refuses most of some 60,000 attempts, asks for no full collection at all. At 5,000 proxies each
    one holds the interpreter, and the /ready thread, for 0.3 s or more (bench/notes.md).

    So: a full collection once ``every`` such streams have ended since the last one, and a last one
    after a tenth of that many, for what a flood leaves behind. Collections are spaced by at least
    ``min_interval``, and by the last one's duration over ``time_share`` up to ``max_interval``: a
    full collection scans every object the proxies' state holds, so its cost grows with the fleet.
    The cap keeps a flood's leftovers bounded however slow they get.
    """

    def __init__(
        self,
        every: int = 1_000,
        min_interval: float = 2.0,
        time_share: float = 0.05,
        max_interval: float = 10.0,
    ) -> None:
        self.every = every
        self.min_interval = min_interval
        self.time_share = time_share
        self.max_interval = max_interval
        #: How long the last full collection took.
        self._took = 0.0
        self._ended = 0
        self._last = 0.0
        self._timer: asyncio.TimerHandle | None = None
        #: A collection is queued with call_soon: the ends until it runs wait for it.
        self._scheduled = False
        self.collections = 0

    def ended(self) -> None:
        self._ended += 1
        if self._scheduled:
            return
        spacing = max(self.min_interval, min(self.max_interval, self._took / self.time_share))
        if self._ended >= self.every and time.monotonic() - self._last >= spacing:
            # Not from inside the stream's own exception handling, whose traceback is still alive.
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._collect)
        elif self._ended >= self.every // 10 and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(spacing, self._collect)

    def _collect(self) -> None:
        self._scheduled = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._ended == 0:
            return
        self._ended = 0
        started = time.monotonic()
        gc.collect()
        # Counted from the end: the interval is time the loop spends on other work.
        self._last = time.monotonic()
        self._took = self._last - started
        self.collections += 1
        log.debug("full collection after ended streams: %.3f s", self._last - started)
