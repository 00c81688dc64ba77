"""What a flood of bad input costs in logs and metrics: bytes and lines written at the server's default
level, tracebacks, and the number of metric series."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from meshpilot.server.logs import OneLineFormatter


class LogVolume(logging.Handler):
    """Counts what meshpilot logs at INFO and above, formatted as the server writes it."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(OneLineFormatter())
        self.bytes = 0
        self.lines = 0
        self.longest = 0
        self.tracebacks: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        size = len(self.format(record).encode()) + 1
        self.bytes += size
        self.lines += 1
        self.longest = max(self.longest, size)
        if record.exc_info:
            self.tracebacks.append(record.getMessage()[:200])


@contextlib.contextmanager
def log_volume(logger: str = "meshpilot") -> Iterator[LogVolume]:
    """Count the records of ``logger`` (at INFO, the server's default) while the block runs."""
    target = logging.getLogger(logger)
    handler = LogVolume()
    level = target.level
    target.setLevel(logging.INFO)
    target.addHandler(handler)
    try:
        yield handler
    finally:
        target.removeHandler(handler)
        target.setLevel(level)


def series(exposition: bytes) -> int:
    """Samples in a Prometheus text exposition: one per series."""
    return sum(1 for line in exposition.decode().splitlines() if line and not line.startswith("#"))
