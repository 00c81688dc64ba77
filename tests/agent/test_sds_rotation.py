"""SDS with rotating credentials: the xDS protocol on the socket, and a real Envoy serving each new
certificate as it is issued without failing a request."""

from __future__ import annotations

import asyncio
import http.client
import ssl
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from agent.test_ca_client import IDENTITY, TOKEN, CaServer, OneToken, new_authority
from cryptography import x509
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.rpc import status_pb2
from support.processes import Envoy, free_port

from meshpilot.agent.sds import SECRET_TYPE, WorkloadCredentials, serve_sds
from meshpilot.agent.workload_secrets import Backoff, WorkloadSecrets
from meshpilot.ca.authority import CertificateAuthority

STREAM_SECRETS = "/envoy.service.secret.v3.SecretDiscoveryService/StreamSecrets"
CREDS_1 = WorkloadCredentials(b"chain-1", b"key-1", b"root")
CREDS_2 = WorkloadCredentials(b"chain-2", b"key-2", b"root")


class RotatingSource:
    """A CredentialSource the test rotates by hand."""

    def __init__(self, credentials: WorkloadCredentials) -> None:
        self.credentials = credentials
        self.callbacks: list[Any] = []

    def current(self) -> WorkloadCredentials:
        return self.credentials

    def subscribe(self, callback: Any) -> None:
        self.callbacks.append(callback)

    def rotate(self, credentials: WorkloadCredentials) -> None:
        self.credentials = credentials
        for callback in self.callbacks:
            callback(credentials)


class SdsClient:
    """One StreamSecrets stream, read by one task (cancelling a pending read would end the call)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._out: asyncio.Queue[discovery_pb2.DiscoveryRequest] = asyncio.Queue()
        self.call = channel.stream_stream(
            STREAM_SECRETS,
            request_serializer=discovery_pb2.DiscoveryRequest.SerializeToString,
            response_deserializer=discovery_pb2.DiscoveryResponse.FromString,
        )(self._requests())
        self._in: asyncio.Queue[discovery_pb2.DiscoveryResponse] = asyncio.Queue()
        self._reader = asyncio.create_task(self._read())

    async def _requests(self) -> AsyncIterator[discovery_pb2.DiscoveryRequest]:
        while True:
            yield await self._out.get()

    async def _read(self) -> None:
        async for response in self.call:
            self._in.put_nowait(response)

    def send(self, names: list[str], nonce: str = "", version: str = "", nack: bool = False) -> None:
        request = discovery_pb2.DiscoveryRequest(
            type_url=SECRET_TYPE, resource_names=names, response_nonce=nonce, version_info=version
        )
        if nack:
            request.error_detail.CopyFrom(status_pb2.Status(code=3, message="bad secret"))
        self._out.put_nowait(request)

    async def recv(self) -> discovery_pb2.DiscoveryResponse:
        return await asyncio.wait_for(self._in.get(), 5)

    async def silent(self, within: float = 0.3) -> bool:
        await asyncio.sleep(within)
        return self._in.empty()

    async def close(self) -> None:
        self.call.cancel()
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)


def _secrets(response: discovery_pb2.DiscoveryResponse) -> dict[str, secret_pb2.Secret]:
    out = {}
    for any_ in response.resources:
        secret = secret_pb2.Secret()
        any_.Unpack(secret)
        out[secret.name] = secret
    return out


async def test_rotation_is_pushed_and_acks_naks_and_stale_nonces_are_not_answered(tmp_path: Path) -> None:
    source = RotatingSource(CREDS_1)
    server, _ = await serve_sds(source, f"unix://{tmp_path}/sds.sock")
    channel = grpc.aio.insecure_channel(f"unix://{tmp_path}/sds.sock")
    default, roots = SdsClient(channel), SdsClient(channel)
    try:
        default.send(["default"])
        first = await default.recv()
        assert _secrets(first)["default"].tls_certificate.certificate_chain.inline_bytes == b"chain-1"
        roots.send(["ROOTCA"])
        root_response = await roots.recv()
        assert _secrets(root_response)["ROOTCA"].validation_context.trusted_ca.inline_bytes == b"root"
        default.send(["default"], first.nonce, first.version_info)
        roots.send(["ROOTCA"], root_response.nonce, root_response.version_info)
        assert await default.silent(), "an ACK is not answered"

        source.rotate(CREDS_2)
        pushed = await default.recv()
        assert pushed.version_info != first.version_info and pushed.nonce != first.nonce
        assert _secrets(pushed)["default"].tls_certificate.private_key.inline_bytes == b"key-2"
        assert await roots.silent(), "the root did not change: nothing is pushed for ROOTCA"

        default.send(["default", "ROOTCA"], first.nonce, first.version_info)
        assert await default.silent(), "a request with a superseded nonce is ignored"
        default.send(["default"], pushed.nonce, first.version_info, nack=True)
        assert await default.silent(), "a NACK is not answered with the same secrets"
        default.send(["default", "ROOTCA"], pushed.nonce, pushed.version_info)
        both = await default.recv()
        assert set(_secrets(both)) == {"default", "ROOTCA"}, "new names are answered"
    finally:
        await default.close()
        await roots.close()
        await channel.close()
        await server.stop(None)


@dataclass
class Load:
    """New TLS connections to Envoy, one request each, until stopped: the serial each saw, and failures."""

    port: int
    root: bytes
    serials: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False  # a workload certificate names a SPIFFE ID, not a host
        context.load_verify_locations(cadata=self.root.decode())
        return context

    def request(self, conn: http.client.HTTPSConnection) -> None:
        conn.request("GET", "/")
        response = conn.getresponse()
        body = response.read()
        if response.status != 200 or body != b"served":
            self.failures.append(f"HTTP {response.status}: {body!r}")

    def connect(self) -> tuple[http.client.HTTPSConnection, int]:
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context(), timeout=5)
        conn.connect()
        assert isinstance(conn.sock, ssl.SSLSocket)
        der = conn.sock.getpeercert(binary_form=True)
        assert der is not None
        return conn, x509.load_der_x509_certificate(der).serial_number

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                conn, serial = self.connect()
                try:
                    self.request(conn)
                finally:
                    conn.close()
                self.serials.append(serial)
            except (OSError, http.client.HTTPException) as err:
                self.failures.append(repr(err))
            time.sleep(0.02)


def _bootstrap(admin: int, listen: int, sds_socket: Path) -> dict[str, Any]:
    sds_config = {
        "resource_api_version": "V3",
        "api_config_source": {
            "api_type": "GRPC",
            "transport_api_version": "V3",
            "grpc_services": [{"envoy_grpc": {"cluster_name": "sds-grpc"}}],
        },
    }
    tls = {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
        "common_tls_context": {
            "tls_certificate_sds_secret_configs": [{"name": "default", "sds_config": sds_config}]
        },
    }
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
        ".HttpConnectionManager",
        "stat_prefix": "tls",
        "http_filters": [
            {
                "name": "envoy.filters.http.router",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                },
            }
        ],
        "route_config": {
            "virtual_hosts": [
                {
                    "name": "all",
                    "domains": ["*"],
                    "routes": [
                        {
                            "match": {"prefix": "/"},
                            "direct_response": {"status": 200, "body": {"inline_string": "served"}},
                        }
                    ],
                }
            ]
        },
    }
    h2 = {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}},
        }
    }
    return {
        "node": {"id": "sidecar~127.0.0.1~sds-test.default~default.svc.cluster.local", "cluster": "sds-test"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "tls",
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen}},
                    "filter_chains": [
                        {
                            "transport_socket": {"name": "envoy.transport_sockets.tls", "typed_config": tls},
                            "filters": [
                                {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}
                            ],
                        }
                    ],
                }
            ],
            "clusters": [
                {
                    "name": "sds-grpc",
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "typed_extension_protocol_options": h2,
                    "load_assignment": {
                        "cluster_name": "sds-grpc",
                        "endpoints": [
                            {"lb_endpoints": [{"endpoint": {"address": {"pipe": {"path": str(sds_socket)}}}}]}
                        ],
                    },
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> CertificateAuthority:
    return new_authority(tmp_path_factory.mktemp("ca"))


@pytest.mark.envoy
@pytest.mark.integration
async def test_envoy_serves_each_rotated_certificate_and_no_request_fails(
    tmp_path: Path, authority: CertificateAuthority
) -> None:
    ca = CaServer(authority, OneToken(TOKEN, IDENTITY))
    await ca.start()
    client = ca.client()
    secrets = WorkloadSecrets(
        client, ttl_seconds=6, algorithm="ecdsa", root_pem=ca.root, backoff=Backoff(0.05, 0.5)
    )
    await secrets.start()
    issued = [secrets.serial]
    secrets.subscribe(lambda _: issued.append(secrets.serial))
    stop = asyncio.Event()
    rotating = asyncio.create_task(secrets.run(stop))
    socket = tmp_path / "sds.sock"
    server, _ = await serve_sds(secrets, f"unix://{socket}")
    admin, listen = free_port(), free_port()
    envoy = Envoy(tmp_path, "sds", _bootstrap(admin, listen, socket), admin)
    load = Load(listen, ca.root)
    loader: asyncio.Future[None] | None = None
    try:
        envoy.start()
        await asyncio.to_thread(envoy.wait_live)
        # A connection made before the rotations, used after them: it keeps its handshake.
        kept, kept_serial = await asyncio.to_thread(load.connect)
        loader = asyncio.ensure_future(asyncio.to_thread(load.run))
        deadline = time.monotonic() + 20
        while not (len(issued) >= 3 and load.serials and load.serials[-1] == issued[-1]):
            assert time.monotonic() < deadline, f"issued {issued}, Envoy served {sorted(set(load.serials))}"
            await asyncio.sleep(0.1)
        await asyncio.to_thread(load.request, kept)
        kept.close()
    finally:
        load.stop.set()
        if loader is not None:
            await loader
        envoy.stop()
        await server.stop(None)
        stop.set()
        await rotating
        await client.close()
        await ca.stop()
    served = list(dict.fromkeys(load.serials))
    assert load.failures == [], envoy.log()[-3000:]
    assert kept_serial in issued
    assert len(served) >= 2, "Envoy served more than one certificate while the load ran"
    assert set(served) <= set(issued), "only certificates the CA issued"
    assert served == [s for s in issued if s in served], "in the order they were issued"
