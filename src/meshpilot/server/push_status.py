"""``/debug/push_status`` and istiod's periodic ``Push Status:`` log line, in istiod's shape.

istiod answers with the last push context's ``ProxyStatus``: problems met while building config,
keyed by the metric that counts them and then by the object concerned, each with an optional proxy
and message (``{"pilot_eds_no_instances": {"outbound|80||a.ns.svc.cluster.local": {}}}``), and an
empty body before the first push. Every 10 seconds, when the push context changed and the status is
not empty, it logs it as ``Push Status: <json>``.

meshpilot keeps no such record on the push path; this works the status out of the current snapshot
when asked. It reports ``pilot_eds_no_instances`` for the outbound cluster of every port of a
client-side load-balanced service that has no endpoint for that port (istiod records it as it builds
each load assignment, subset clusters included; subsets are not listed here). istiod's other keys
(conflicting listeners, duplicated clusters and domains, duplicated subsets, endpoints without pods)
come from checks meshpilot does not make, and never appear.
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from meshpilot.model.endpoint_index import EndpointIndex
from meshpilot.model.push_context import PushContext
from meshpilot.model.service import Resolution
from meshpilot.xds.introspect import ConnectedProxies

log = logging.getLogger(__name__)

#: istiod's ``periodicRefreshMetrics``.
LOG_INTERVAL = 10.0
NO_INSTANCES = "pilot_eds_no_instances"


def proxy_status(push: PushContext, index: EndpointIndex) -> dict[str, dict[str, dict[str, str]]]:
    """istiod's ``PushContext.ProxyStatus`` for ``push``: {metric: {key: {"proxy", "message"}}}."""
    empty: dict[str, dict[str, str]] = {}
    for svc in push.services:
        if svc.resolution is not Resolution.CLIENT_SIDE_LB:
            continue
        shards = index.shards(svc.hostname, svc.namespace)
        served = set()
        if shards is not None:
            served = {ep.service_port_name for _, ep in shards.endpoints()}
        for port in svc.ports:
            if port.name not in served:
                empty[f"outbound|{port.port}||{svc.hostname}"] = {}
    return {NO_INSTANCES: empty} if empty else {}


def status_json(status: dict[str, Any]) -> bytes:
    """As Go's ``json.MarshalIndent(status, "", "    ")`` writes it (keys sorted)."""
    return json.dumps(status, indent=4, sort_keys=True, separators=(",", ": ")).encode()


def push_status_page(proxies: ConnectedProxies) -> Callable[[Mapping[str, str], str], web.Response]:
    """``/debug/push_status`` as the debug page set holds it (``server.debug.Page``)."""

    def page(query: Mapping[str, str], scope: str = "") -> web.Response:
        push = proxies.push_context
        if push is None:
            return web.Response(body=b"")  # istiod's answer before the first push
        return web.Response(
            body=status_json(proxy_status(push, proxies.index)), content_type="application/json"
        )

    return page


async def log_push_status(
    current: Callable[[], PushContext | None], index: EndpointIndex, interval: float = LOG_INTERVAL
) -> None:
    """Until cancelled: each ``interval``, a ``Push Status:`` line if the snapshot changed and the
    status is not empty (istiod's ``periodicRefreshMetrics``)."""
    last: weakref.ref[PushContext] | None = None
    while True:
        await asyncio.sleep(interval)
        last = _log_if_new(current(), last, index)


def _log_if_new(
    push: PushContext | None, last: weakref.ref[PushContext] | None, index: EndpointIndex
) -> weakref.ref[PushContext] | None:
    # Weakly, and no snapshot in the loop's locals: the one logged last must not outlive its
    # successor by up to an interval (after a large file is removed: every service it had, for 10 s).
    if push is None or (last is not None and last() is push):
        return last
    if log.isEnabledFor(logging.INFO):
        status = proxy_status(push, index)
        if status:
            log.info("Push Status: %s", status_json(status).decode())
    return weakref.ref(push)
