"""What the cyclic collector would be left to free: checks with the collector off."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

MEGABYTE = 1_000_000


@contextmanager
def collector_off() -> Iterator[None]:
    """Only reference counting frees anything inside."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def megabytes_held() -> int:
    """Strings and bytes of a megabyte or more that objects the collector tracks (frames, generators,
    exceptions) still hold. Only str and bytes: a protobuf message keeps its bytes out of sight."""
    return sum(
        1
        for holder in gc.get_objects()
        for value in gc.get_referents(holder)
        if isinstance(value, (bytes, str)) and len(value) >= MEGABYTE
    )
