"""Route retry policies: istiod's retry.ConvertPolicy, the mesh default overridden by a VirtualService."""

from __future__ import annotations

from typing import Any

from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.extensions.retry.host.previous_hosts.v3 import previous_hosts_pb2
from envoy.extensions.retry.priority.previous_priorities.v3 import previous_priorities_config_pb2

from meshpilot.networking.protobuf import pack, uint32

DEFAULT_RETRY_ON = "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
# Numbers in retryOn that are HTTP statuses become retriable_status_codes.
_HTTP_STATUS_TEXT = frozenset(
    {
        100,
        101,
        102,
        103,
        200,
        201,
        202,
        203,
        204,
        205,
        206,
        207,
        208,
        226,
        300,
        301,
        302,
        303,
        304,
        305,
        307,
        308,
        400,
        401,
        402,
        403,
        404,
        405,
        406,
        407,
        408,
        409,
        410,
        411,
        412,
        413,
        414,
        415,
        416,
        417,
        418,
        421,
        422,
        423,
        424,
        425,
        426,
        428,
        429,
        431,
        451,
        500,
        501,
        502,
        503,
        504,
        505,
        506,
        507,
        508,
        510,
        511,
    }
)


def previous_hosts_predicate() -> Any:
    return rc.RetryPolicy.RetryHostPredicate(
        name="envoy.retry_host_predicates.previous_hosts",
        typed_config=pack(previous_hosts_pb2.PreviousHostsPredicate()),
    )


def retry_policy(retries: Any | None, *, consistent_hash: bool = False) -> Any | None:
    """istiod's ``retry.ConvertPolicy``: the default policy, overridden by ``retries``."""
    out = rc.RetryPolicy(
        retry_on=DEFAULT_RETRY_ON, num_retries=uint32(2), host_selection_retry_max_attempts=5
    )
    if not consistent_hash:
        out.retry_host_predicate.append(previous_hosts_predicate())
    if retries is None:
        return out
    if retries.attempts <= 0:
        return None  # retries explicitly disabled
    out.num_retries.value = retries.attempts
    if retries.retry_on:
        conditions, codes = [], []
        for part in (p.strip() for p in retries.retry_on.split(",")):
            if not part:
                continue
            if part.isdigit() and int(part) in _HTTP_STATUS_TEXT:
                codes.append(int(part))
            else:
                conditions.append(part)
        out.retry_on = ",".join(conditions)
        out.retriable_status_codes.extend(codes)
        if codes and "retriable-status-codes" not in out.retry_on:
            out.retry_on += ",retriable-status-codes"
    if retries.HasField("per_try_timeout"):
        out.per_try_timeout.CopyFrom(retries.per_try_timeout)
    if retries.HasField("retry_ignore_previous_hosts"):
        del out.retry_host_predicate[:]
        if retries.retry_ignore_previous_hosts.value:
            out.retry_host_predicate.append(previous_hosts_predicate())
    if retries.HasField("retry_remote_localities") and retries.retry_remote_localities.value:
        out.retry_priority.name = "envoy.retry_priorities.previous_priorities"
        out.retry_priority.typed_config.CopyFrom(
            pack(previous_priorities_config_pb2.PreviousPrioritiesConfig(update_frequency=2))
        )
    if retries.HasField("backoff"):
        out.retry_back_off.base_interval.CopyFrom(retries.backoff)
    return out
