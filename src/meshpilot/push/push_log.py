"""istiod's push log lines: the debounce that starts a push, and each response a proxy is sent.

The texts follow istiod's (``Push debounce stable[N] M for config K: ...``, ``CDS: PUSH for
node:ID resources:N size:1.2kB``) so that what people grep for in istiod's logs finds the same lines
here. They log under ``meshpilot.push.push_log``, which ``server.logs`` puts in istiod's ``ads``
scope.

One deliberate difference: istiod logs each response of a full push at info level; meshpilot logs
them at debug (``--log_output_level=ads:debug``), as istiod does for endpoint pushes. Thousands of
proxies times four types is thousands of lines per push, and formatting them would cost the push
loop more than the push itself for small configs.
"""

from __future__ import annotations

import logging

from meshpilot.model.push_request import PushRequest
from meshpilot.push.debounce import Debounced

log = logging.getLogger(__name__)


def go_duration(seconds: float) -> str:
    """``seconds`` as Go prints a ``time.Duration`` (``1.5s``, ``100.25ms``, ``12µs``)."""
    nanos = round(seconds * 1e9)
    if nanos == 0:
        return "0s"
    sign = "-" if nanos < 0 else ""
    nanos = abs(nanos)
    if nanos >= 60_000_000_000:
        minutes, rest = divmod(nanos, 60_000_000_000)
        hours, minutes = divmod(minutes, 60)
        head = f"{hours}h{minutes}m" if hours else f"{minutes}m"
        whole, part = divmod(rest, 1_000_000_000)
        fraction = f"{part:09d}".rstrip("0")
        return f"{sign}{head}{whole}{'.' + fraction if fraction else ''}s"
    for unit, size in (("s", 1_000_000_000), ("ms", 1_000_000), ("µs", 1_000)):
        if nanos >= size:
            whole, part = divmod(nanos, size)
            digits = len(str(size)) - 1
            fraction = f"{part:0{digits}d}".rstrip("0")
            return f"{sign}{whole}{'.' + fraction if fraction else ''}{unit}"
    return f"{sign}{nanos}ns"


def byte_count(size: int) -> str:
    """istiod's size text: ``512B``, ``1.2kB``, ``3.4MB`` (powers of 1000)."""
    if size < 1000:
        return f"{size}B"
    value = size / 1000
    units = iter("kMGTPE")
    unit = next(units)
    while value >= 1000:
        value /= 1000
        unit = next(units)
    return f"{value:.1f}{unit}B"


def configs_text(request: PushRequest) -> str:
    """The first changed config and how many more (istiod names one, in no particular order)."""
    keys = request.configs_updated
    first = min(keys, key=lambda k: k.sort_key())
    return f"{first} and {len(keys) - 1} more configs" if len(keys) > 1 else str(first)


def reasons_text(request: PushRequest) -> str:
    reasons = sorted(((r.value, n) for r, n in request.reasons.items()), key=lambda i: (-i[1], i[0]))
    if not reasons:
        return "unknown"
    (first, count), *rest = reasons
    if not rest:
        return f"{first}:{count}"
    if len(rest) == 1:
        return f"{first}:{count} and {rest[0][0]}:{rest[0][1]}"
    return f"{first}:{count} and {len(rest)}({sum(n for _, n in rest)}) more reasons"


def log_debounced(request: PushRequest, how: Debounced, number: str) -> None:
    """The line istiod logs when a debounced burst becomes push ``number`` (``7``; a push worker's
    own push after the main process's 7th: ``7+1``)."""
    if not log.isEnabledFor(logging.INFO):
        return
    if request.configs_updated:
        what = f"for config {configs_text(request)}"
    else:
        what = f"for reason {reasons_text(request)}"
    log.info(
        "Push debounce stable[%s] %d %s: %s since last change, %s since last push, forced=%s",
        number,
        how.events,
        what,
        go_duration(how.since_last),
        go_duration(how.since_first),
        "true" if request.forced else "false",
    )


def log_sent(
    short_type: str,
    proxy_id: str,
    resources: int,
    size: int,
    *,
    pushed: bool,
    incremental: bool,
    removed: int = 0,
    nonce: str = "",
    version: str = "",
) -> None:
    """One response sent to a proxy (debug level; see the module's note)."""
    if not log.isEnabledFor(logging.DEBUG):
        return
    kind = "PUSH INC" if incremental else "PUSH"
    reason = "" if pushed else " request"
    removed_text = f" removed:{removed}" if removed else ""
    log.debug(
        "%s: %s%s for node:%s resources:%d%s size:%s nonce:%s version:%s",
        short_type.upper(),
        kind,
        reason,
        proxy_id,
        resources,
        removed_text,
        byte_count(size),
        nonce,
        version,
    )
