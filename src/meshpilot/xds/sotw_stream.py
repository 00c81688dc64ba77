"""State-of-the-world ADS (StreamAggregatedResources): every response carries the whole watched state."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf.message import DecodeError

from meshpilot.model.push_request import PushRequest
from meshpilot.networking import wire
from meshpilot.push.history import TypeSent
from meshpilot.push.push_log import log_sent
from meshpilot.xds import protocol, request_head, responses
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.generators.base import Resource, digest_of, names_of
from meshpilot.xds.stream import Stream
from meshpilot.xds.types import TypeUrl

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Incoming:
    """A request as read, with its head scanned once (see ``_scan``)."""

    raw: bytes
    #: (type URL, nonce, hash of the names' bytes) when the head can be read without a parse.
    head: tuple[str, str, int] | None


class SotwStream(Stream):
    """Serves one SotW ADS stream: requests arrive as bytes, most are ACKs recorded without a parse."""

    protocol = "sotw"

    async def _first(self, requests: AsyncIterator[bytes]) -> tuple[base_pb2.Node, _Incoming] | None:
        try:
            raw = await anext(requests)
        except StopAsyncIteration:
            return None
        request = await self._parse(raw)
        return request.node, self._scan(raw)

    def _scan(self, raw: bytes) -> _Incoming:
        try:
            head = request_head.scan(raw)
        except ValueError:
            return _Incoming(raw, None)  # the full parse reports what is wrong
        if head[3] & request_head.FLAG_FULL_PARSE:
            return _Incoming(raw, None)
        # Names as bytes: equal bytes hash alike, so an unchanged ACK needs no parse. Hashed in place
        # (a view hashes as its bytes): an EDS ACK's names are 50 KB at 1,000 clusters.
        return _Incoming(raw, (head[0], head[1], hash(memoryview(raw)[head[4] : head[5]])))

    def _quiet_ack(self, incoming: _Incoming) -> bool:
        """See ``protocol.quiet_ack``."""
        assert self.conn is not None
        return incoming.head is not None and protocol.quiet_ack(self.conn, *incoming.head)

    async def _parse(self, raw: bytes) -> discovery_pb2.DiscoveryRequest:
        try:
            return discovery_pb2.DiscoveryRequest.FromString(raw)
        except DecodeError as err:
            await self._refuse(
                "malformed", grpc.StatusCode.INVALID_ARGUMENT, f"malformed DiscoveryRequest: {err}"
            )

    async def _handle_request(self, incoming: _Incoming) -> None:
        conn = self.conn
        assert conn is not None
        if self._quiet_ack(incoming):
            return
        digest = incoming.head[2] if incoming.head is not None else None
        request = await self._parse(incoming.raw)
        type_url = request.type_url
        if type_url == TypeUrl.HEALTH:
            return
        known = self._served(type_url)
        if known is None:
            return
        await self._check_names(type_url, request.resource_names)
        names = list(request.resource_names)
        if known.is_debug:
            await self._answer_debug(known, names)
            return
        error = request.error_detail.message if request.HasField("error_detail") else None
        decision = protocol.decide(conn, type_url, names, request.response_nonce, error, digest)
        if decision.verdict is protocol.Verdict.NACK:
            self._on_nack(known, request.response_nonce, error or "")
            return
        if decision.verdict is protocol.Verdict.STALE:
            self.host.metrics.expired_nonce.labels(type=known.short).inc()
            return
        if decision.respond:
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
        metrics = self.host.metrics
        # The whole watched state, or only part of it (an endpoint push, added names)?
        whole = (names is None and request.full) or known.is_wildcard or names == watch.names
        digest = digest_of(resources) if whole else None
        if pushed and digest is not None and digest == watch.digest_sent:
            # SotW lets a server stay silent when nothing changed; Envoy would
            # only compare and drop the same config again.
            metrics.for_type(known.short).unchanged_skipped.inc()
            self._record_held(watch, digest)
            return
        version = request.push.version
        payloads = [r.payload for r in resources]
        nonce, payload = responses.for_stream(
            request,
            self.protocol,
            type_url,
            resources,
            (),
            lambda nonce: wire.discovery_response(version, type_url, nonce, payloads),
            pushed=pushed,
        )
        by_type = metrics.for_type(known.short)
        by_type.push_time.observe(time.monotonic() - started)
        if known is TypeUrl.CLUSTER:
            eds = conn.watched.get(TypeUrl.ENDPOINT)
            if eds is not None:
                # Changed clusters warm until they get endpoints; Envoy's next EDS
                # request may name the same clusters and still needs an answer. Set
                # before the write: the reader may see that request before the write
                # returns, and must not take it for a quiet ACK.
                eds.always_respond = True
        await self._write(payload)
        by_type.pushes.inc()
        by_type.config_size.observe(len(payload))
        sent_names = names_of(resources)
        partial = names is not None or not request.full
        if self._sent is not None:
            before = None if partial else watch.sent_names
            self._sent.append(TypeSent(known.short, sent_names, len(payload), before=before))
        log_sent(
            known.short,
            conn.proxy.id,
            len(resources),
            len(payload),
            pushed=pushed,
            incremental=partial,
            nonce=nonce,
            version=version,
        )
        _record_sent(watch, version, nonce, sent_names, partial=partial)
        self._record_held(watch, digest)

    async def _write_once(
        self, type_url: TypeUrl, version: str, resources: list[Resource], control_plane: str
    ) -> None:
        response = discovery_pb2.DiscoveryResponse(
            version_info=version,
            type_url=type_url.value,
            nonce=responses.new_nonce(version),
            resources=[r.message() for r in resources],
        )
        if control_plane:
            response.control_plane.identifier = control_plane
        await self.context.write(response.SerializeToString())


def _record_sent(
    watch: WatchedResource, version: str, nonce: str, names: frozenset[str], *, partial: bool
) -> None:
    watch.nonce_sent = nonce
    watch.version_sent = version
    watch.last_sent = time.time()
    if not partial:
        watch.sent_names = names
    elif not names <= watch.sent_names:
        # An endpoint push usually resends names the proxy has: no new set then.
        watch.sent_names = watch.sent_names | names


__all__ = ["SotwStream"]
