"""Logging: one line per record with time, level and scope, as istiod logs."""

from __future__ import annotations

import logging
import sys
import time

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "none": logging.CRITICAL + 1,
}


class OneLineFormatter(logging.Formatter):
    """``2026-01-02T03:04:05.123456Z  info  meshpilot.xds.server  message``; tracebacks folded in."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        return f"{base}.{int((record.created % 1) * 1_000_000):06d}Z"

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info:
            message = f"{message} | {self.formatException(record.exc_info)}"
        level = record.levelname.lower().replace("warning", "warn")
        text = f"{self.formatTime(record)}\t{level}\t{record.name}\t{message}"
        return text.replace("\r", "").replace("\n", " | ")


def configure(level: str) -> None:
    if level not in LEVELS:
        raise ValueError(f"unknown log level {level!r} (one of {', '.join(LEVELS)})")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLineFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(LEVELS[level])
    # gRPC and aiohttp are chatty at info.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
