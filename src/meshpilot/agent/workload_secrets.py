"""The workload's certificate: obtained from the mesh CA at start and rotated before it expires.

pilot-agent's secret cache, in its rules: a new key and CSR for every certificate
(the key stays in memory), rotation when ``SECRET_GRACE_PERIOD_RATIO`` (0.5) of the
lifetime is left, a failed renewal retried with bounded exponential backoff while
the old certificate keeps being served, and the root served as ``ROOTCA`` taken
from the CA's answer (the last certificate of the chain).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from meshpilot.agent.ca_client import CaError, new_key_and_csr
from meshpilot.agent.sds import WorkloadCredentials

log = logging.getLogger(__name__)


class CertificateSigner(Protocol):
    """What the secrets need of the CA (``CaClient`` is one)."""

    async def sign(self, csr_pem: bytes, ttl_seconds: int) -> list[str]: ...


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff between failed attempts: ``initial`` doubling up to ``maximum``, each
    delay shortened by up to 20% at random so a fleet restarted together does not retry together."""

    initial: float = 1.0
    maximum: float = 30.0

    def delay(self, failures: int) -> float:
        base = min(self.maximum, self.initial * 2.0 ** max(0, failures - 1))
        return base * random.uniform(0.8, 1.0)


class NoCertificateError(RuntimeError):
    """The first certificate could not be obtained within the allowed attempts."""


@dataclass(frozen=True, slots=True)
class _Issued:
    credentials: WorkloadCredentials
    serial: int
    not_after: float
    rotate_at: float


class WorkloadSecrets:
    """The current workload credentials, renewed in the background by ``run``."""

    def __init__(
        self,
        ca: CertificateSigner,
        *,
        ttl_seconds: int = 86400,
        grace_ratio: float = 0.5,
        algorithm: str = "rsa",
        root_pem: bytes,
        identity_hint: str | None = None,
        backoff: Backoff = Backoff(),
        start_attempts: int = 10,
        jitter: float = 0.1,
    ) -> None:
        if not 0.0 < grace_ratio < 1.0:
            raise ValueError(f"grace_ratio must be between 0 and 1, not {grace_ratio}")
        if start_attempts < 1:
            raise ValueError("start_attempts must be at least 1")
        self._ca = ca
        self._ttl = ttl_seconds
        self._grace = grace_ratio
        self._algorithm = algorithm
        self._root_pem = root_pem
        self._identity_hint = identity_hint
        self._backoff = backoff
        self._start_attempts = start_attempts
        self._jitter = jitter
        self._issued: _Issued | None = None
        self._subscribers: list[Callable[[WorkloadCredentials], None]] = []
        #: Failed renewals since the last success, and in all (for logs and status).
        self.failures = 0
        self.total_failures = 0

    async def start(self) -> None:
        """Get the first certificate; NoCertificateError after ``start_attempts`` failures."""
        for attempt in range(1, self._start_attempts + 1):
            try:
                self._install(await self._issue())
                return
            except CaError as err:
                self.total_failures += 1
                if attempt == self._start_attempts:
                    raise NoCertificateError(
                        f"no workload certificate after {attempt} attempts: {err}"
                    ) from err
                delay = self._backoff.delay(attempt)
                log.warning(
                    "cannot get a workload certificate (attempt %d): %s; retrying in %.1fs",
                    attempt,
                    err,
                    delay,
                )
                await asyncio.sleep(delay)

    def current(self) -> WorkloadCredentials:
        return self._current().credentials

    @property
    def serial(self) -> int:
        """The serial number of the current leaf."""
        return self._current().serial

    @property
    def renewal_time(self) -> float:
        """When (UNIX time) the current certificate is due for renewal, before jitter."""
        return self._current().rotate_at

    def _current(self) -> _Issued:
        if self._issued is None:
            raise RuntimeError("WorkloadSecrets.start() has not obtained a certificate yet")
        return self._issued

    def subscribe(self, callback: Callable[[WorkloadCredentials], None]) -> None:
        """Call ``callback`` with the new credentials after each rotation."""
        self._subscribers.append(callback)

    async def run(self, stop: asyncio.Event) -> None:
        """Rotate until ``stop`` is set."""
        while not stop.is_set():
            issued = self._current()
            if self.failures:
                delay = self._backoff.delay(self.failures)
            else:
                delay = max(0.0, issued.rotate_at - time.time())
                # Shortened a little at random, so workloads started together do not renew together.
                delay -= random.uniform(0.0, self._jitter * delay)
            if await _wait(stop, delay):
                return
            try:
                renewed = await self._issue()
            except Exception as err:  # any failure retries with backoff: an expired certificate is worse
                self.failures += 1
                self.total_failures += 1
                left = issued.not_after - time.time()
                log.warning(
                    "workload certificate renewal failed (%d in a row, %d in all; the current one %s): %s",
                    self.failures,
                    self.total_failures,
                    f"expires in {left:.0f}s" if left > 0 else "has expired",
                    err,
                )
                continue
            self.failures = 0
            self._install(renewed)

    def _install(self, issued: _Issued) -> None:
        self._issued = issued
        log.info(
            "workload certificate %x valid until %s, renewal at %s",
            issued.serial,
            _iso(issued.not_after),
            _iso(issued.rotate_at),
        )
        for callback in list(self._subscribers):
            try:
                callback(issued.credentials)
            except Exception:  # one broken subscriber must not stop the others or the rotation
                log.exception("a workload certificate subscriber failed")

    async def _issue(self) -> _Issued:
        # Key generation (RSA especially) takes tens of milliseconds: off the event loop.
        key_pem, csr_pem = await asyncio.to_thread(new_key_and_csr, self._identity_hint, self._algorithm)
        chain = await self._ca.sign(csr_pem, self._ttl)
        received = time.time()
        leaf = _leaf_matching(chain[0], key_pem)
        # pilot-agent serves the root the CA answered with; a CA that sends only the leaf leaves
        # the configured root.
        root = chain[-1].encode() if len(chain) > 1 else self._root_pem
        credentials = WorkloadCredentials(_join(chain), key_pem, root)
        not_before = leaf.not_valid_before_utc.timestamp()
        not_after = leaf.not_valid_after_utc.timestamp()
        # The CA back-dates notBefore by its clock-skew allowance (minutes), which would put the
        # renewal of a short-lived certificate in the past: the lifetime is counted from when the
        # certificate arrived, as pilot-agent counts it from when it was made.
        start = max(not_before, received)
        rotate_at = not_after - self._grace * max(0.0, not_after - start)
        return _Issued(credentials, leaf.serial_number, not_after, rotate_at)


def _leaf_matching(leaf_pem: str, key_pem: bytes) -> x509.Certificate:
    """The leaf, checked to certify our key: serving a certificate for another key would fail
    every handshake, which is worse than keeping the old one."""
    try:
        leaf = x509.load_pem_x509_certificate(leaf_pem.encode())
    except ValueError as err:
        raise CaError(grpc.StatusCode.INTERNAL, f"the CA's leaf certificate does not parse: {err}") from None
    key = serialization.load_pem_private_key(key_pem, password=None)
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    if leaf.public_key().public_bytes(serialization.Encoding.DER, spki) != key.public_key().public_bytes(
        serialization.Encoding.DER, spki
    ):
        raise CaError(grpc.StatusCode.INTERNAL, "the CA's leaf certificate is not for the key of the CSR")
    return leaf


def _join(chain: list[str]) -> bytes:
    return "".join(p if p.endswith("\n") else p + "\n" for p in chain).encode()


def _iso(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp, datetime.UTC).isoformat(timespec="seconds")


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` unless ``stop`` is set first; True when stopped."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()
