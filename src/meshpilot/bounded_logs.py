"""Client text in log lines and status messages, bounded; repeated warnings, rate-limited.

A proxy or a webhook caller chooses what its requests carry: a NACK's
``error_detail``, type URLs, a node ID, resource names. Written whole, one
client can fill the disk (a 1 MB node ID per line) or push a gRPC status past
the client's 8 KB metadata limit; written as is, a newline forges a log line.
``clip`` makes any such text one short, printable, ASCII line.
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: Client text in a log line: IDs, names, type URLs.
LOG_CHARS = 256
#: A NACK's error_detail: Envoy's reasons name the resource and field, and fit.
DETAIL_CHARS = 1024
#: A gRPC status message: gRPC clients refuse trailers over 8 KB, and percent-encode what is not
#: printable ASCII; ``clip`` output is printable ASCII, so this stays far below.
STATUS_CHARS = 1024
#: The message of a denied AdmissionReview, shown to whoever applied the object: room for a
#: validation error list, not for the 1 MB value a caller put in a field.
DENIAL_CHARS = 4096


def truncate(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters and a note of how long it was; for text whose encoder
    escapes it (JSON), so that only its length needs a bound."""
    return text if len(text) <= limit else f"{text[:limit]}...({len(text)} chars)"


def clip(text: str, limit: int = LOG_CHARS) -> str:
    """``text`` as printable ASCII (other characters escaped as Python does), at most ``limit``
    characters and a note of how long it was."""
    # ascii() escapes at most 10 characters per character; clip before escaping what is not shown.
    escaped = ascii(text[: limit + 1])[1:-1]
    if len(text) <= limit and len(escaped) <= limit:
        return escaped
    return f"{escaped[:limit]}...({len(text)} chars)"


class WarningBudget:
    """At most ``burst`` warnings per ``interval`` seconds, for one proxy (each stream holds one);
    what is held back is counted and reported with the next warning let through."""

    __slots__ = ("_burst", "_clock", "_interval", "_spent", "_window_end", "suppressed")

    def __init__(
        self, burst: int = 5, interval: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._burst = burst
        self._interval = interval
        self._clock = clock
        self._spent = 0
        self._window_end = 0.0
        #: Warnings held back since the last one let through.
        self.suppressed = 0

    def allow(self) -> bool:
        """Whether to write the next warning; if so, add ``take_suppressed()`` to it."""
        now = self._clock()
        if now >= self._window_end:
            self._window_end = now + self._interval
            self._spent = 0
        if self._spent < self._burst:
            self._spent += 1
            return True
        self.suppressed += 1
        return False

    def take_suppressed(self) -> str:
        """A note of how many warnings were held back (empty if none), resetting the count."""
        count, self.suppressed = self.suppressed, 0
        return f" ({count} similar warnings suppressed)" if count else ""
