"""istiod's serving certificate: renewed at half its life, and the secure port serves the new one to
the next handshake without a restart, while a connection made before keeps working."""

from __future__ import annotations

import asyncio
import datetime
import socket
import ssl
from pathlib import Path

import grpc
from cryptography import x509

from meshpilot.ca.authority import CertificateAuthority
from meshpilot.ca.keys import load_or_create_self_signed
from meshpilot.ca.serving import ServingCertificate, ServingPair, istiod_dns_names
from meshpilot.server.secure_grpc import server_credentials

ISTIOD = "istiod.istio-system.svc"


def _authority(tmp_path: Path) -> CertificateAuthority:
    signing = load_or_create_self_signed(tmp_path, "cluster.local", "ecdsa")
    return CertificateAuthority(signing, (), (signing.certificate,))


def _served_serial(port: int, root: str) -> int:
    context = ssl.create_default_context(cadata=root)
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=ISTIOD) as tls,
    ):
        return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True) or b"").serial_number


def test_istiods_names_in_its_namespace() -> None:
    assert istiod_dns_names("mesh", "example.org", ("localhost",)) == [
        "istiod",
        "istiod.mesh",
        "istiod.mesh.svc",
        "istiod.mesh.svc.example.org",
        "localhost",
    ]


async def test_a_renewal_reaches_the_next_handshake_and_run_renews_at_half_life(tmp_path: Path) -> None:
    authority = _authority(tmp_path)
    serving = ServingCertificate(authority, [ISTIOD], ttl=datetime.timedelta(seconds=4))
    renewed: list[int] = []
    renewed_at: list[datetime.datetime] = []
    renewal = asyncio.Event()

    def on_renewal(pair: ServingPair) -> None:
        renewed.append(x509.load_pem_x509_certificate(pair.chain_pem).serial_number)
        renewed_at.append(datetime.datetime.now(datetime.UTC))
        renewal.set()

    serving.subscribe(on_renewal)
    server = grpc.aio.server()
    port = server.add_secure_port("127.0.0.1:0", server_credentials(serving))
    await server.start()
    try:
        root = authority.root_pem
        # A channel made now keeps working across the renewals below.
        channel = grpc.aio.secure_channel(
            f"127.0.0.1:{port}",
            grpc.ssl_channel_credentials(root.encode()),
            options=[("grpc.ssl_target_name_override", ISTIOD)],
        )
        await asyncio.wait_for(channel.channel_ready(), 5)
        first = await asyncio.to_thread(_served_serial, port, root)
        # Half of four seconds from when it was made, not at once (its notBefore is backdated two
        # minutes for skew). notAfter keeps whole seconds and the issuance time is read after signing,
        # so the half is a little under 1.5 to 2 seconds; it counts from issuance, not from here (the
        # set-up above may take a while on a busy host).
        issued = serving.current.issued_at
        due = serving.renew_at()
        assert datetime.timedelta(seconds=1.4) <= due - issued <= datetime.timedelta(seconds=2)
        stop = asyncio.Event()
        runner = asyncio.create_task(serving.run(stop))
        await asyncio.wait_for(renewal.wait(), 10)
        assert renewed_at[0] >= due - datetime.timedelta(milliseconds=50)
        assert await asyncio.to_thread(_served_serial, port, root) == renewed[-1] != first
        assert channel.get_state() is grpc.ChannelConnectivity.READY
        stop.set()
        await asyncio.wait_for(runner, 5)
        await channel.close()
    finally:
        await server.stop(None)
