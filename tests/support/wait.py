"""Bounded polling for conditions that become true asynchronously."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(check: Callable[[], T], *, timeout: float = 10.0, interval: float = 0.05, what: str = "") -> T:
    """Call ``check`` until it returns a truthy value (returned) or ``timeout`` passes (AssertionError).

    An exception from ``check`` counts as "not yet"; the last one is reported.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = check()
            if value:
                return value
            last = value
        except Exception as err:
            last = err
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what or check}: last result {last!r}"
            )
        time.sleep(interval)
