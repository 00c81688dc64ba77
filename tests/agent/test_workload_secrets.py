"""Workload certificates from a real CA over TLS: obtained at start, rotated before expiry, kept
through a CA outage, renewed when the CA is back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from agent.test_ca_client import IDENTITY, TOKEN, CaServer, OneToken, new_authority
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from meshpilot.agent.ca_client import CaClient
from meshpilot.agent.sds import WorkloadCredentials
from meshpilot.agent.workload_secrets import Backoff, NoCertificateError, WorkloadSecrets
from meshpilot.ca.authority import CertificateAuthority

FAST = Backoff(initial=0.05, maximum=0.2)


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> CertificateAuthority:
    return new_authority(tmp_path_factory.mktemp("ca"))


@pytest.fixture
async def ca(authority: CertificateAuthority) -> AsyncIterator[CaServer]:
    server = CaServer(authority, OneToken(TOKEN, IDENTITY))
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def client(ca: CaServer) -> AsyncIterator[CaClient]:
    client = ca.client()
    yield client
    await client.close()


def _leaf(credentials: WorkloadCredentials) -> x509.Certificate:
    return x509.load_pem_x509_certificates(credentials.cert_chain)[0]


async def _until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        await asyncio.sleep(0.05)


class Running:
    """``WorkloadSecrets.run`` in a task, stopped (and awaited) at the end."""

    def __init__(self, secrets: WorkloadSecrets) -> None:
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(secrets.run(self.stop))

    async def close(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 5)


async def test_the_first_certificate_is_the_workloads_with_the_cas_root(
    ca: CaServer, client: CaClient
) -> None:
    secrets = WorkloadSecrets(
        client, ttl_seconds=3600, algorithm="ecdsa", root_pem=b"", identity_hint=IDENTITY
    )
    await secrets.start()
    credentials = secrets.current()
    leaf = _leaf(credentials)
    assert leaf.serial_number == secrets.serial
    assert leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.UniformResourceIdentifier
    ) == [IDENTITY]
    key = serialization.load_pem_private_key(credentials.private_key, password=None)
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    assert key.public_key().public_bytes(serialization.Encoding.DER, spki) == leaf.public_key().public_bytes(
        serialization.Encoding.DER, spki
    )
    assert credentials.root_cert == ca.root, "ROOTCA is the root the CA answered with"
    assert credentials.cert_chain.endswith(ca.root), "default is the whole chain, as pilot-agent serves it"
    # Renewal when half the lifetime is left, counted from arrival (the CA back-dates notBefore).
    assert secrets.renewal_time - time.time() == pytest.approx(1800, abs=10)


async def test_rotation_before_expiry_notifies_subscribers(ca: CaServer, client: CaClient) -> None:
    secrets = WorkloadSecrets(client, ttl_seconds=3, algorithm="ecdsa", root_pem=ca.root, backoff=FAST)
    await secrets.start()
    first = secrets.current()
    seen: list[tuple[float, WorkloadCredentials]] = []
    secrets.subscribe(lambda c: seen.append((time.time(), c)))
    running = Running(secrets)
    try:
        await _until(lambda: len(seen) >= 2, 8, "two rotations")
    finally:
        await running.close()
    previous = first
    for when, credentials in seen[:2]:
        old = _leaf(previous)
        assert _leaf(credentials).serial_number != old.serial_number
        assert credentials.private_key != previous.private_key, "a new key each time"
        # Before expiry only: a three-second certificate leaves a busy host no margin to ask more
        # (the renewal at half the life is pinned by the test above).
        assert when < old.not_valid_after_utc.timestamp(), "renewed before the old one expired"
        previous = credentials
    assert secrets.current() == seen[-1][1]
    assert secrets.failures == 0


async def test_a_failed_renewal_keeps_the_old_certificate_and_recovers(
    ca: CaServer, client: CaClient
) -> None:
    secrets = WorkloadSecrets(client, ttl_seconds=2, algorithm="ecdsa", root_pem=ca.root, backoff=FAST)
    await secrets.start()
    before = secrets.serial
    renewed: list[WorkloadCredentials] = []
    secrets.subscribe(renewed.append)
    await ca.stop()
    running = Running(secrets)
    try:
        await _until(lambda: secrets.failures >= 3, 6, "failed renewals")
        assert renewed == []
        assert secrets.serial == before, "the old certificate is still served"
        await ca.start()
        await _until(lambda: bool(renewed), 5, "a renewal once the CA is back")
    finally:
        await running.close()
    assert _leaf(renewed[0]).serial_number != before
    assert secrets.total_failures >= 3


async def test_start_gives_up_after_the_allowed_attempts(ca: CaServer) -> None:
    client = ca.client(token="not-the-token")
    secrets = WorkloadSecrets(client, root_pem=ca.root, backoff=FAST, start_attempts=3, algorithm="ecdsa")
    try:
        with pytest.raises(NoCertificateError, match=r"after 3 attempts: .*UNAUTHENTICATED"):
            await secrets.start()
    finally:
        await client.close()
    assert secrets.total_failures == 3
    assert len(ca.authenticator.seen) == 3
    with pytest.raises(RuntimeError, match="has not obtained a certificate"):
        secrets.current()


async def test_a_subscriber_that_fails_does_not_stop_the_others(ca: CaServer, client: CaClient) -> None:
    secrets = WorkloadSecrets(client, ttl_seconds=2, algorithm="ecdsa", root_pem=ca.root, backoff=FAST)
    await secrets.start()
    got: list[WorkloadCredentials] = []

    def broken(_: WorkloadCredentials) -> None:
        raise RuntimeError("broken subscriber")

    secrets.subscribe(broken)
    secrets.subscribe(got.append)
    running = Running(secrets)
    try:
        await _until(lambda: bool(got), 5, "a rotation")
    finally:
        await running.close()


def test_bad_settings_are_refused(tmp_path: Path) -> None:
    client = CaClient("127.0.0.1:1", root_pem=b"", token=lambda: None)
    with pytest.raises(ValueError, match="grace_ratio"):
        WorkloadSecrets(client, root_pem=b"", grace_ratio=1.0)
    with pytest.raises(ValueError, match="start_attempts"):
        WorkloadSecrets(client, root_pem=b"", start_attempts=0)
