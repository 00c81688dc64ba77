"""The agent's SDS server: serves the workload certificate and the mesh roots to Envoy.

In a pod pilot-agent serves two secrets on a Unix socket that the bootstrap's
``sds-grpc`` cluster points at: ``default`` (the workload's certificate chain
and key) and ``ROOTCA`` (the roots to verify peers with), and the files a
DestinationRule names for TLS origination (``file-cert:``, ``file-root:``). Envoy keeps
clusters and listeners that reference them warming until they arrive. The
credentials come from PEM files (fixed) or from a source that rotates them
(``WorkloadSecrets``); on a rotation every open stream is sent the secrets it
watches again, under a new version.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import grpc
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.service.discovery.v3 import discovery_pb2

from meshpilot.grpc_bind import bind
from meshpilot.networking.names import SDS_DEFAULT, SDS_ROOTCA
from meshpilot.networking.protobuf import pack
from meshpilot.networking.tls import FILE_CERT_PREFIX, FILE_ROOT_PREFIX
from meshpilot.networking.tls import SYSTEM_ROOTS as SYSTEM_ROOTS_NAME

log = logging.getLogger(__name__)

SECRET_TYPE = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
SDS_SERVICE = "envoy.service.secret.v3.SecretDiscoveryService"


@dataclass(frozen=True, slots=True)
class WorkloadCredentials:
    cert_chain: bytes
    private_key: bytes
    root_cert: bytes

    @classmethod
    def from_files(cls, cert_chain: Path, private_key: Path, root_cert: Path) -> WorkloadCredentials:
        return cls(cert_chain.read_bytes(), private_key.read_bytes(), root_cert.read_bytes())

    def secret(self, name: str) -> secret_pb2.Secret | None:
        if name == SDS_DEFAULT:
            out = secret_pb2.Secret(name=name)
            out.tls_certificate.certificate_chain.inline_bytes = self.cert_chain
            out.tls_certificate.private_key.inline_bytes = self.private_key
            return out
        if name == SDS_ROOTCA:
            out = secret_pb2.Secret(name=name)
            out.validation_context.trusted_ca.inline_bytes = self.root_cert
            return out
        return file_secret(name)


#: Where the system's trusted roots are, for ``file-root:system`` (Debian, then Red Hat layouts).
SYSTEM_ROOTS = (Path("/etc/ssl/certs/ca-certificates.crt"), Path("/etc/pki/tls/certs/ca-bundle.crt"))


def file_secret(name: str) -> secret_pb2.Secret | None:
    """A secret a DestinationRule names by file, as pilot-agent serves them.

    ``file-cert:<chain>~<key>`` is a client certificate, ``file-root:<bundle>``
    (or ``file-root:system``) the roots to verify a server with. None, logged,
    when the name is not one of these or a file cannot be read: Envoy keeps
    waiting for it, as it would for pilot-agent.
    """
    try:
        if name.startswith(FILE_CERT_PREFIX):
            chain, sep, key = name[len(FILE_CERT_PREFIX) :].partition("~")
            if not sep:
                log.warning("SDS: %s names no key file (file-cert:<chain>~<key>)", name)
                return None
            out = secret_pb2.Secret(name=name)
            out.tls_certificate.certificate_chain.inline_bytes = Path(chain).read_bytes()
            out.tls_certificate.private_key.inline_bytes = Path(key).read_bytes()
            return out
        if name.startswith(FILE_ROOT_PREFIX):
            path = name[len(FILE_ROOT_PREFIX) :]
            if path == SYSTEM_ROOTS_NAME:
                found = next((p for p in SYSTEM_ROOTS if p.exists()), None)
                if found is None:
                    log.warning("SDS: no system root bundle found for %s", name)
                    return None
                path = str(found)
            out = secret_pb2.Secret(name=name)
            out.validation_context.trusted_ca.inline_bytes = Path(path).read_bytes()
            return out
    except OSError as err:
        log.warning("SDS: cannot read the files of %s: %s", name, err)
        return None
    return None


class CredentialSource(Protocol):
    """Credentials that change (``WorkloadSecrets``): the current ones, and a call on each change."""

    def current(self) -> WorkloadCredentials: ...

    def subscribe(self, callback: Callable[[WorkloadCredentials], None]) -> None: ...


class SdsServer:
    """SotW SDS over gRPC for one workload.

    Per stream, as the xDS protocol has it: a request without a nonce (a new or
    resumed stream) or with other names is answered; one whose nonce is the last
    response's is an ACK or a NACK and is not answered; one with an older nonce
    replies to a response already superseded and is ignored. A change of the
    credentials is sent, under a new version, to each stream whose secrets it changes.
    """

    def __init__(self, credentials: WorkloadCredentials) -> None:
        self._credentials = credentials
        #: Bumped on every change; streams wait for it to differ from the one they sent.
        self._version = 1
        #: Set (and replaced) on every change, waking every stream.
        self._changed = asyncio.Event()

    def replace(self, credentials: WorkloadCredentials) -> None:
        """Replace the credentials; every stream sends the secrets that changed."""
        self._credentials = credentials
        self._version += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def update(self, credentials: WorkloadCredentials) -> None:
        """``replace``, for callers that await."""
        self.replace(credentials)

    def _secrets(self, names: frozenset[str]) -> list[secret_pb2.Secret]:
        return [s for s in (self._credentials.secret(n) for n in sorted(names)) if s is not None]

    def _response(self, secrets: list[secret_pb2.Secret]) -> discovery_pb2.DiscoveryResponse:
        return discovery_pb2.DiscoveryResponse(
            version_info=str(self._version),
            type_url=SECRET_TYPE,
            nonce=uuid.uuid4().hex,
            resources=[pack(s) for s in secrets],
        )

    async def stream_secrets(
        self, requests: AsyncIterator[discovery_pb2.DiscoveryRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[discovery_pb2.DiscoveryResponse]:
        names: frozenset[str] = frozenset()
        sent_version = 0
        last_nonce = ""
        sent: list[secret_pb2.Secret] = []
        incoming: asyncio.Queue[discovery_pb2.DiscoveryRequest | None] = asyncio.Queue()

        async def read() -> None:
            try:
                async for request in requests:
                    await incoming.put(request)
            finally:
                await incoming.put(None)

        reader = asyncio.create_task(read())
        try:
            while True:
                get = asyncio.create_task(incoming.get())
                change = asyncio.create_task(self._wait_change(sent_version))
                done, pending = await asyncio.wait({get, change}, return_when=asyncio.FIRST_COMPLETED)
                for task in pending:
                    task.cancel()
                if get in done:
                    request = get.result()
                    if request is None:
                        return
                    if request.response_nonce and request.response_nonce != last_nonce:
                        continue  # answers a response already superseded; the newer one is on its way
                    if request.HasField("error_detail"):
                        log.warning("SDS: Envoy rejected secrets: %s", request.error_detail.message)
                        continue
                    wanted = frozenset(request.resource_names)
                    if request.response_nonce and wanted == names:
                        continue  # an ACK
                    names = wanted
                elif not names or self._secrets(names) == sent:
                    # Nothing this stream watches changed (the root is often the same after a
                    # rotation): Envoy is not made to rebuild a TLS context for nothing.
                    sent_version = self._version
                    continue
                sent_version = self._version
                sent = self._secrets(names)
                response = self._response(sent)
                last_nonce = response.nonce
                yield response
        finally:
            reader.cancel()

    async def _wait_change(self, seen: int) -> None:
        while self._version == seen:
            await self._changed.wait()

    def grpc_handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SDS_SERVICE,
            {
                "StreamSecrets": grpc.stream_stream_rpc_method_handler(
                    self.stream_secrets,
                    request_deserializer=discovery_pb2.DiscoveryRequest.FromString,
                    response_serializer=discovery_pb2.DiscoveryResponse.SerializeToString,
                )
            },
        )


async def serve_sds(
    source: WorkloadCredentials | CredentialSource, address: str
) -> tuple[grpc.aio.Server, SdsServer]:
    """Start an SDS server on ``address`` (``unix:///path`` or ``host:port``).

    ``source`` is fixed credentials, or a ``CredentialSource`` whose changes are pushed to Envoy.
    """
    if isinstance(source, WorkloadCredentials):
        sds = SdsServer(source)
    else:
        sds = SdsServer(source.current())
        source.subscribe(sds.replace)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([sds.grpc_handler()])
    bind(server, address, "SDS")
    await server.start()
    return server, sds
