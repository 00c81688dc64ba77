"""What an aborted gRPC call leaves behind, made small as it ends.

``context.abort`` raises ``grpc.aio.AbortError``, and grpc keeps that exception in a reference
cycle with the call's state, which only a full collection frees. With the exception stay the frames
of its traceback and of every exception it was raised while handling, and their variables: the
stream, a refused megabyte node ID in the frame that parsed it, a CSR. CPython runs full
collections rarely (``server.gc_tuning``), so an abort's handler clears those frames first.

Only frames that have returned may be cleared. In Python 3.11 ``frame.clear()`` on a suspended
coroutine's frame closes the coroutine; a frame still running refuses (``traceback.clear_frames``
ignores that). The caller is therefore the frame that caught the abort: every frame in the chain has
then either returned (the abort, or the exception it was raised while handling, propagated out of
it) or is still running (the catcher, its callers, a worker thread) and is skipped. Never chain an
abort to an exception a coroutine caught and still holds while suspended (``raise ... from`` a
stored exception): that coroutine would be closed.
"""

from __future__ import annotations

import logging
import traceback

log = logging.getLogger(__name__)


def clear_abort_frames(err: BaseException) -> None:
    """Clear the variables of every returned frame in ``err``'s traceback and in those of the
    exceptions chained to it (``__cause__`` and ``__context__`` both: they differ when an exception
    was raised ``from`` another while handling a third). Never raises: a failure is logged and the
    abort goes on as it would have."""
    try:
        pending = [err]
        seen: set[int] = set()
        while pending:
            chained = pending.pop()
            if id(chained) in seen:
                continue
            seen.add(id(chained))
            traceback.clear_frames(chained.__traceback__)
            pending += [e for e in (chained.__cause__, chained.__context__) if e is not None]
    except Exception:  # the abort's own status matters more than this cleanup
        log.exception("could not clear the frames of an aborted call")
