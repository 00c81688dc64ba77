"""A heartbeat of the main event loop, so probes answered on another thread can tell it is stuck.

``/ready`` and ``/healthz/live`` are served on the HTTP port's own thread
(``http.ThreadedSite``) so that they do not wait behind a long push queue. The
price is that they answered 200 while the main loop was frozen (a file that
never finished decoding: pushes, webhooks and debug pages all stalled). The
loop now stamps the time every ``interval``; the probes compare the stamp
with the clock:

- ready: stamped within ``ready_stall`` (5 s). Longer than any stall a healthy
  server shows (a full GC pause at 2,000 proxies was 0.3 s, building a push
  for 10,000 new services 0.5 s), short next to Kubernetes' probe period, so
  traffic goes elsewhere soon after the loop stops and comes back when it moves.
- live: stamped within ``live_stall`` (60 s). Restarting loses every
  proxy's stream, so only a loop stuck far longer than any burst of work should
  make Kubernetes kill the pod.

The stamp is a float written by one thread and read by others: a plain
attribute read, atomic under the GIL.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HeartbeatOptions:
    interval: float = 0.25
    ready_stall: float = 5.0
    live_stall: float = 60.0


class LoopHeartbeat:
    """Stamps ``time.monotonic()`` from the loop it is started on, every ``interval``."""

    def __init__(
        self,
        options: HeartbeatOptions | None = None,
        clock: Callable[[], float] = time.monotonic,
        stamp: Callable[[float], None] | None = None,
    ) -> None:
        """``stamp`` also gets each stamp (a push worker's goes to memory its supervisor reads)."""
        self.options = options or HeartbeatOptions()
        self._clock = clock
        self._stamp = stamp
        self.last = clock()
        self._handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Begin stamping from the running loop (until ``stop``)."""
        self._beat(asyncio.get_running_loop())

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def stalled_for(self) -> float:
        """Seconds since the loop last stamped (any thread may ask)."""
        return max(0.0, self._clock() - self.last)

    def moving(self) -> bool:
        """The loop made progress recently enough to take traffic."""
        return self.stalled_for() <= self.options.ready_stall

    def alive(self) -> bool:
        """The loop made progress recently enough not to be restarted."""
        return self.stalled_for() <= self.options.live_stall

    def _beat(self, loop: asyncio.AbstractEventLoop) -> None:
        self.last = self._clock()
        if self._stamp is not None:
            self._stamp(self.last)
        self._handle = loop.call_later(self.options.interval, self._beat, loop)
