"""The agent's xDS proxy: Envoy's ADS on a Unix socket, relayed to istiod.

As pilot-agent's proxy does, each stream Envoy opens gets its own upstream
stream on its own connection (so a reconnect dials afresh instead of waiting out
a broken channel's backoff), authenticated as the agent is (token, cluster ID,
TLS against the mesh root). Messages are relayed as bytes, unparsed, so the
proxy serves whatever protocol Envoy speaks (SotW or delta). The two streams end
together: when istiod ends its stream, Envoy's ends with the same status
(Envoy reconnects with its own backoff); when Envoy goes away, istiod's stream
is cancelled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc

from meshpilot.agent.ca_client import DEFAULT_CLUSTER_ID, call_metadata, open_channel
from meshpilot.grpc_bind import bind

log = logging.getLogger(__name__)

ADS_SERVICE = "envoy.service.discovery.v3.AggregatedDiscoveryService"
ADS_METHODS = ("StreamAggregatedResources", "DeltaAggregatedResources")
#: xDS responses for a large mesh run to tens of megabytes; gRPC's default limit is 4 MiB.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
#: Envoy opens one ADS stream; a few more allow for a restart overlapping the old one.
MAX_STREAMS = 16
_CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # pilot-agent's keepalive to istiod: a dead connection is noticed within about 40 s.
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
)


def _replace_socket(path: Path) -> None:
    # A socket left by an agent that died would make the listen fail (EADDRINUSE).
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)


def _identity(payload: bytes) -> bytes:
    return payload


class XdsProxy:
    """Relays Envoy's ADS streams from a Unix socket to ``upstream``."""

    def __init__(
        self,
        upstream: str,
        *,
        root_pem: bytes | None,
        token: Callable[[], str | None],
        server_name: str | None = None,
        cluster_id: str = DEFAULT_CLUSTER_ID,
    ) -> None:
        self.upstream = upstream
        self._root_pem = root_pem
        self._token = token
        self._server_name = server_name
        self._cluster_id = cluster_id
        self._server: grpc.aio.Server | None = None
        #: Upstream channels of the streams being relayed, closed by ``stop`` if a stream outlives it.
        self._channels: set[grpc.aio.Channel] = set()
        #: Streams that upstream ended (with an error or not), and all relayed streams (logs, status).
        self.upstream_failures = 0
        self.streams = 0

    @property
    def open_streams(self) -> int:
        """Streams being relayed now."""
        return len(self._channels)

    async def start(self, uds_path: Path) -> None:
        """Listen on ``uds_path`` (a stale socket from an earlier run is replaced)."""
        _replace_socket(uds_path)
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ],
            maximum_concurrent_rpcs=MAX_STREAMS,
        )
        server.add_generic_rpc_handlers([self._handler()])
        # ``unix:PATH`` takes a relative path too (``unix://`` only an absolute one): the agent binds
        # relative to its root to stay under the 108-byte limit of a socket path.
        bind(server, f"unix:{uds_path}", "the xDS proxy", where=str(uds_path))
        await server.start()
        self._server = server
        log.info("xDS proxy: Envoy's ADS on %s, relayed to %s", uds_path, self.upstream)

    async def stop(self, grace: float = 1.0) -> None:
        """Stop accepting, give open streams ``grace`` seconds, then cancel them. Idempotent."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace)
        for channel in list(self._channels):
            await channel.close()
        self._channels.clear()

    def _handler(self) -> grpc.GenericRpcHandler:
        def relay(method: str) -> grpc.RpcMethodHandler:
            path = f"/{ADS_SERVICE}/{method}"

            async def handle(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
                await self._relay(path, requests, context)

            return grpc.stream_stream_rpc_method_handler(
                handle, request_deserializer=_identity, response_serializer=_identity
            )

        return grpc.method_handlers_generic_handler(ADS_SERVICE, {m: relay(m) for m in ADS_METHODS})

    async def _relay(
        self, path: str, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> None:
        self.streams += 1
        channel = open_channel(
            self.upstream, root_pem=self._root_pem, server_name=self._server_name, options=_CHANNEL_OPTIONS
        )
        self._channels.add(channel)
        call = channel.stream_stream(path, request_serializer=_identity, response_deserializer=_identity)(
            # Never the token over plaintext (controlPlaneAuthPolicy NONE): anyone on the path could
            # replay it to the CA for this workload's certificate.
            metadata=call_metadata(self._token if self._root_pem is not None else _no_token, self._cluster_id)
        )
        sender = asyncio.create_task(_send(requests, call))
        try:
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    break
                await context.write(response)
            code, details = await call.code(), await call.details()
        except grpc.aio.AioRpcError as err:
            code, details = err.code(), err.details()
        finally:
            # Whichever side ended, the other is ended too; nothing of this stream is left running.
            sender.cancel()
            call.cancel()
            (sent,) = await asyncio.gather(sender, return_exceptions=True)
            if isinstance(sent, Exception):
                log.warning("xDS proxy: relaying Envoy's requests failed: %r", sent)
            self._channels.discard(channel)
            await channel.close()
        # An xDS stream is not meant to end: every end from upstream, even with OK, cut Envoy off.
        self.upstream_failures += 1
        log.warning(
            "xDS proxy: upstream %s ended the stream with %s: %s (%d upstream ends in %d streams)",
            self.upstream,
            code.name,
            details,
            self.upstream_failures,
            self.streams,
        )
        context.set_code(code)
        context.set_details(details or "")


async def _send(requests: AsyncIterator[bytes], call: grpc.aio.StreamStreamCall) -> None:
    """Envoy's requests to istiod, then a half-close when Envoy half-closes."""
    try:
        async for request in requests:
            await call.write(request)
        await call.done_writing()
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
        # The upstream call has ended; its status, read by the relay, is what Envoy is told.
        return


def _no_token() -> str | None:
    return None
