"""Delta ADS (DeltaAggregatedResources): responses carry only what changed for this proxy.

The resources are the same bytes the state-of-the-world stream sends; only
the envelope and the bookkeeping differ (``delta_protocol``). After clusters
change, their endpoints are sent again at once: Envoy warms an updated
cluster until its assignment arrives, and a delta client does not ask again
for a name it is already subscribed to (istiod does the same on a CDS request).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf.message import DecodeError

from meshpilot.model.push_request import PushRequest
from meshpilot.push.history import TypeSent
from meshpilot.push.push_log import log_sent
from meshpilot.xds import delta_protocol, responses
from meshpilot.xds.delta_wire import delta_response
from meshpilot.xds.generators.base import Resource, digest_of, names_of
from meshpilot.xds.stream import Stream
from meshpilot.xds.types import TypeUrl

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Malformed:
    error: str


#: A parsed DeltaDiscoveryRequest (the generated classes carry no static types).
_Request = Any


class DeltaStream(Stream):
    """Serves one delta ADS stream."""

    protocol = "delta"

    async def _first(self, requests: AsyncIterator[bytes]) -> tuple[base_pb2.Node, _Request] | None:
        async for raw in requests:
            incoming = self._scan(raw)
            if isinstance(incoming, _Malformed):
                await self._refuse("malformed", grpc.StatusCode.INVALID_ARGUMENT, incoming.error)
            if incoming.type_url == TypeUrl.HEALTH:
                continue  # a health probe may come before the first real request (istiod skips it)
            return incoming.node, incoming
        return None

    def _scan(self, raw: bytes) -> _Request | _Malformed:
        # Delta requests are small (an ACK is a type URL and a nonce): parsing each costs little.
        try:
            request: _Request = discovery_pb2.DeltaDiscoveryRequest.FromString(raw)
            return request
        except DecodeError as err:
            return _Malformed(f"malformed DeltaDiscoveryRequest: {err}")

    def _quiet_ack(self, incoming: _Request | _Malformed) -> bool:
        conn = self.conn
        assert conn is not None
        if isinstance(incoming, _Malformed) or not incoming.response_nonce:
            return False
        if (
            incoming.resource_names_subscribe
            or incoming.resource_names_unsubscribe
            or incoming.initial_resource_versions
            or incoming.HasField("error_detail")
        ):
            return False
        watch = conn.watched.get(incoming.type_url)
        if watch is None or incoming.response_nonce != watch.nonce_sent:
            return False
        watch.nonce_acked = watch.nonce_sent
        watch.version_acked = watch.version_sent
        watch.last_error = ""
        return True

    async def _handle_request(self, incoming: _Request | _Malformed) -> None:
        conn = self.conn
        assert conn is not None
        if isinstance(incoming, _Malformed):
            await self._refuse("malformed", grpc.StatusCode.INVALID_ARGUMENT, incoming.error)
        if self._quiet_ack(incoming):
            return
        type_url = incoming.type_url
        if type_url == TypeUrl.HEALTH:
            return
        known = self._served(type_url)
        if known is None:
            return
        if known.is_debug:
            await self._answer_delta_debug(known, incoming.resource_names_subscribe)
            return
        error = incoming.error_detail.message if incoming.HasField("error_detail") else None
        try:
            decision = delta_protocol.decide(
                conn,
                type_url,
                incoming.resource_names_subscribe,
                incoming.resource_names_unsubscribe,
                incoming.initial_resource_versions,
                incoming.response_nonce,
                error,
            )
        except delta_protocol.RefusedRequest as err:
            if err.exhausted:
                await self._refuse("subscriptions", grpc.StatusCode.RESOURCE_EXHAUSTED, str(err))
            await self._refuse("names", grpc.StatusCode.INVALID_ARGUMENT, str(err))
        if decision.verdict is delta_protocol.Verdict.NACK:
            self._on_nack(known, incoming.response_nonce, error or "")
        elif decision.verdict is delta_protocol.Verdict.STALE:
            self.host.metrics.expired_nonce.labels(type=known.short).inc()
        if decision.respond:
            # Also after a NACK or a stale nonce: the names it newly subscribes are owed.
            await self._answer(type_url, decision.names)

    async def _send(
        self, type_url: str, request: PushRequest, names: frozenset[str] | None, *, pushed: bool
    ) -> None:
        conn = self.conn
        assert conn is not None and request.push is not None
        started = time.monotonic()
        found = self._generate(type_url, request, names)
        if found is None:
            return
        known, watch, resources = found
        by_type = self.host.metrics.for_type(known.short)
        # Everything the watch holds (so what is missing was removed), or a part of it?
        whole = names is None and (request.full or known.is_wildcard)
        digest = digest_of(resources) if whole else None
        if pushed and digest is not None and digest == watch.digest_sent:
            by_type.unchanged_skipped.inc()
            self._record_held(watch, digest)
            return
        changes = delta_protocol.changes(watch, resources, whole=whole)
        kept = len(resources) - len(changes.updated)
        if kept:
            by_type.delta_kept.inc(kept)
        if pushed and not changes:
            self._record_held(watch, digest)
            by_type.unchanged_skipped.inc()
            return
        # A request is always answered, even with nothing: Envoy's initial fetch waits for a response.
        version = request.push.version
        nonce, payload = responses.for_stream(
            request,
            self.protocol,
            type_url,
            changes.updated,
            changes.removed,
            partial(delta_response, version, type_url, changes=changes),
            pushed=pushed,
        )
        by_type.push_time.observe(time.monotonic() - started)
        warming: frozenset[str] = frozenset()
        if known is TypeUrl.CLUSTER and changes.updated:
            eds = conn.watched.get(TypeUrl.ENDPOINT)
            if eds is not None:
                warming = frozenset(r.name for r, _ in changes.updated) & eds.names
                delta_protocol.forget(eds, warming)
        await self._write(payload)
        by_type.pushes.inc()
        by_type.config_size.observe(len(payload))
        if self._sent is not None:
            # Everything changed (a new proxy, a new snapshot): the list's shared name set, not a copy.
            whole_list = len(changes.updated) == len(resources)
            sent = names_of(resources) if whole_list else tuple(r.name for r, _ in changes.updated)
            self._sent.append(TypeSent(known.short, sent, len(payload), dropped=tuple(changes.removed)))
        log_sent(
            known.short,
            conn.proxy.id,
            len(changes.updated),
            len(payload),
            pushed=pushed,
            incremental=not whole,
            removed=len(changes.removed),
            nonce=nonce,
            version=version,
        )
        delta_protocol.record_sent(watch, changes)
        watch.nonce_sent = nonce
        watch.version_sent = version
        watch.last_sent = time.time()
        self._record_held(watch, digest)
        if warming:
            await self._send(TypeUrl.ENDPOINT, request, warming, pushed=False)

    async def _answer_delta_debug(self, known: TypeUrl, names: Sequence[str]) -> None:
        # The bounds every request gets; decide() would apply them, but a debug request keeps no state.
        await self._check_names(known.value, names)
        await self._answer_debug(known, names)

    async def _write_once(
        self, type_url: TypeUrl, version: str, resources: list[Resource], control_plane: str
    ) -> None:
        response = discovery_pb2.DeltaDiscoveryResponse(
            system_version_info=version,
            type_url=type_url.value,
            nonce=responses.new_nonce(version),
        )
        for resource in resources:
            response.resources.add(name=resource.name, version=version, resource=resource.message())
        if control_plane:
            response.control_plane.identifier = control_plane
        await self.context.write(response.SerializeToString())


__all__ = ["DeltaStream"]
