"""A minimal ADS client over real gRPC, for protocol tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import struct_pb2
from google.rpc import status_pb2

ADS_METHOD = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
DELTA_METHOD = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"


def node(node_id: str, metadata: dict[str, Any] | None = None) -> base_pb2.Node:
    meta = struct_pb2.Struct()
    meta.update(metadata or {"NAMESPACE": "default", "ISTIO_VERSION": "1.28.0", "INTERCEPTION_MODE": "NONE"})
    return base_pb2.Node(id=node_id, cluster="test", metadata=meta)


@dataclass(frozen=True)
class Secure:
    """How to reach the secure port: the mesh root, istiod's name, and the caller's credential."""

    root_pem: bytes
    token: str | None = None
    client_key_pem: bytes | None = None
    client_chain_pem: bytes | None = None
    server_name: str = "istiod.istio-system.svc"

    def channel(self, target: str, options: list[tuple[str, Any]] | None = None) -> grpc.aio.Channel:
        credentials = grpc.ssl_channel_credentials(self.root_pem, self.client_key_pem, self.client_chain_pem)
        return grpc.aio.secure_channel(
            target,
            credentials,
            options=[("grpc.ssl_target_name_override", self.server_name), *(options or ())],
        )

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()


class _StreamClient:
    """One ADS stream: requests queued by ``send``, responses read by one task (cancelling a pending
    read cancels the whole call), both protocols alike."""

    def __init__(
        self,
        target: str,
        method: str,
        serializer: Any,
        deserializer: Any,
        secure: Secure | None,
        own_connection: bool,
    ) -> None:
        # gRPC shares one TCP connection between a process's channels to one target; a push-worker
        # pool's kernel picks a worker per connection, so a client that must land anywhere asks for
        # its own.
        options = [("grpc.use_local_subchannel_pool", 1)] if own_connection else None
        self.channel = (
            secure.channel(target, options) if secure else grpc.aio.insecure_channel(target, options)
        )
        self._out: asyncio.Queue[Any] = asyncio.Queue()
        self.call = self.channel.stream_stream(
            method, request_serializer=serializer, response_deserializer=deserializer
        )(self._requests(), metadata=secure.metadata() if secure else None)
        self._in: asyncio.Queue[Any] = asyncio.Queue()
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        try:
            while True:
                response = await self.call.read()
                if response is grpc.aio.EOF:
                    self._in.put_nowait(EOFError("stream ended"))
                    return
                self._in.put_nowait(response)
        except BaseException as err:
            self._in.put_nowait(err)

    async def _requests(self):  # type: ignore[no-untyped-def]
        while True:
            item = await self._out.get()
            if item is None:
                return
            yield item

    async def _next(self, timeout: float) -> Any:
        item = await asyncio.wait_for(self._in.get(), timeout)
        if isinstance(item, BaseException):
            raise item
        return item

    async def no_response(self, within: float = 0.5) -> bool:
        try:
            await self._next(within)
        except TimeoutError:
            return True
        return False

    async def close(self) -> None:
        self._out.put_nowait(None)
        self.call.cancel()
        self._reader.cancel()
        await self.channel.close()


class AdsClient(_StreamClient):
    def __init__(self, target: str, *, secure: Secure | None = None, own_connection: bool = False) -> None:
        super().__init__(
            target,
            ADS_METHOD,
            discovery_pb2.DiscoveryRequest.SerializeToString,
            discovery_pb2.DiscoveryResponse.FromString,
            secure,
            own_connection,
        )

    def send(
        self,
        type_url: str,
        names: list[str] | None = None,
        *,
        nonce: str = "",
        version: str = "",
        error: str | None = None,
        node_id: str | None = None,
        node_metadata: dict[str, Any] | None = None,
    ) -> None:
        request = discovery_pb2.DiscoveryRequest(
            type_url=type_url, resource_names=names or [], response_nonce=nonce, version_info=version
        )
        if node_id is not None:
            request.node.CopyFrom(node(node_id, node_metadata))
        if error is not None:
            request.error_detail.CopyFrom(status_pb2.Status(code=3, message=error))
        self._out.put_nowait(request)

    def send_message(self, request: discovery_pb2.DiscoveryRequest) -> None:
        self._out.put_nowait(request)

    def ack(self, response: discovery_pb2.DiscoveryResponse, names: list[str] | None = None) -> None:
        self.send(response.type_url, names, nonce=response.nonce, version=response.version_info)

    async def recv(self, timeout: float = 5.0) -> discovery_pb2.DiscoveryResponse:
        return await self._next(timeout)


def lost_status(err: grpc.aio.AioRpcError) -> bool:
    """grpc/grpc#36066: when the server ends a call while the client's write of a request is still
    completing, grpc.aio reports INTERNAL "Internal error from Core" instead of the server's status."""
    return err.code() is grpc.StatusCode.INTERNAL and err.details() == "Internal error from Core"


async def refusal(
    target: str, send: Callable[[AdsClient], None], attempts: int = 5, *, secure: Secure | None = None
) -> grpc.aio.AioRpcError:
    """The status a server ends a stream with after ``send``'s requests, asking again (on a new stream)
    while grpc.aio loses it to the race above; a served stream fails the caller's test."""
    for _ in range(attempts):
        client = AdsClient(target, secure=secure)
        send(client)
        try:
            await client.recv()
        except grpc.aio.AioRpcError as err:
            if not lost_status(err):
                return err
        else:
            raise AssertionError("the stream was served, not refused")
        finally:
            await client.close()
    raise AssertionError(f"grpc.aio lost the server's status on all {attempts} streams")


class DeltaClient(_StreamClient):
    """A delta ADS client: requests as Envoy's delta subscription sends them, responses as read."""

    def __init__(self, target: str, *, secure: Secure | None = None, own_connection: bool = False) -> None:
        super().__init__(
            target,
            DELTA_METHOD,
            lambda raw: raw,
            discovery_pb2.DeltaDiscoveryResponse.FromString,
            secure,
            own_connection,
        )

    def send(
        self,
        type_url: str,
        subscribe: list[str] | None = None,
        unsubscribe: list[str] | None = None,
        *,
        nonce: str = "",
        initial: dict[str, str] | None = None,
        error: str | None = None,
        node_id: str | None = None,
        node_metadata: dict[str, Any] | None = None,
    ) -> None:
        request = discovery_pb2.DeltaDiscoveryRequest(
            type_url=type_url,
            resource_names_subscribe=subscribe or [],
            resource_names_unsubscribe=unsubscribe or [],
            response_nonce=nonce,
            initial_resource_versions=initial or {},
        )
        if node_id is not None:
            request.node.CopyFrom(node(node_id, node_metadata))
        if error is not None:
            request.error_detail.CopyFrom(status_pb2.Status(code=3, message=error))
        self.send_raw(request.SerializeToString())

    def send_raw(self, raw: bytes) -> None:
        self._out.put_nowait(raw)

    def ack(self, response: discovery_pb2.DeltaDiscoveryResponse) -> None:
        self.send(response.type_url, nonce=response.nonce)

    async def recv(self, timeout: float = 5.0) -> discovery_pb2.DeltaDiscoveryResponse:
        return await self._next(timeout)
