"""istiod's own serving certificate (the secure xDS port and the webhooks), signed by the mesh CA.

The names are those agents and the API server dial: ``istiod.<ns>.svc`` and the shorter and longer
spellings. The certificate lives a day and is renewed at half its life, so a rotation is routine
and a CA whose root changes reaches the servers within hours.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cryptography import x509

from meshpilot.ca.authority import DEFAULT_WORKLOAD_TTL, CertificateAuthority, IPAddress

log = logging.getLogger(__name__)


def istiod_dns_names(namespace: str, domain: str, extra: tuple[str, ...] = ()) -> list[str]:
    """The names of istiod's Service in ``namespace``, as agents and the API server spell them."""
    names = ["istiod", f"istiod.{namespace}", f"istiod.{namespace}.svc", f"istiod.{namespace}.svc.{domain}"]
    return [*names, *(n for n in extra if n not in names)]


@dataclass(frozen=True, slots=True)
class ServingPair:
    key_pem: bytes
    chain_pem: bytes
    not_after: datetime.datetime
    #: When it was made: its life counts from here, not from notBefore, which is backdated for skew.
    issued_at: datetime.datetime


class ServingCertificate:
    """The current serving key and chain; renewed by ``run`` before it expires."""

    def __init__(
        self,
        authority: CertificateAuthority,
        dns_names: list[str],
        *,
        ip_addresses: Sequence[IPAddress] = (),
        ttl: datetime.timedelta = DEFAULT_WORKLOAD_TTL,
        renew_ratio: float = 0.5,
    ) -> None:
        self.authority = authority
        self.dns_names = dns_names
        self.ip_addresses = tuple(ip_addresses)
        self._ttl = ttl
        self._renew_ratio = renew_ratio
        self._lock = threading.Lock()
        self._listeners: list[Callable[[ServingPair], None]] = []
        #: Bumped at each renewal, so a TLS server can tell it has an old pair (read from gRPC's threads).
        self.generation = 0
        self._pair = self._issue()

    def _issue(self) -> ServingPair:
        key_pem, chain = self.authority.serving(self.dns_names, self._ttl, self.ip_addresses)
        leaf = x509.load_pem_x509_certificate(chain[0].encode())
        # The chain served ends below the root: a client has the root and a served root is ignored.
        served = "".join(chain[:-1]) if len(chain) > 1 else chain[0]
        return ServingPair(
            key_pem.encode(), served.encode(), leaf.not_valid_after_utc, datetime.datetime.now(datetime.UTC)
        )

    @property
    def current(self) -> ServingPair:
        with self._lock:
            return self._pair

    def subscribe(self, listener: Callable[[ServingPair], None]) -> None:
        self._listeners.append(listener)

    def renew(self) -> ServingPair:
        pair = self._issue()
        with self._lock:
            self._pair = pair
            self.generation += 1
        log.info("renewed istiod's serving certificate (valid until %s)", pair.not_after.isoformat())
        for listener in self._listeners:
            try:
                listener(pair)
            except Exception:  # one server failing to take the new pair must not keep it from the others
                log.exception("a server could not take the renewed serving certificate")
        return pair

    def renew_at(self) -> datetime.datetime:
        pair = self.current
        return pair.issued_at + (pair.not_after - pair.issued_at) * self._renew_ratio

    async def run(self, stop: asyncio.Event) -> None:
        """Renew at the chosen share of each certificate's life until ``stop``; a failure retries."""
        while not stop.is_set():
            wait = (self.renew_at() - datetime.datetime.now(datetime.UTC)).total_seconds()
            try:
                await asyncio.wait_for(stop.wait(), timeout=max(wait, 0.0))
                return
            except TimeoutError:
                pass
            try:
                self.renew()
            except Exception:  # keep serving the old pair; try again shortly
                log.exception("cannot renew istiod's serving certificate; retrying in 30s")
                try:
                    await asyncio.wait_for(stop.wait(), timeout=30.0)
                    return
                except TimeoutError:
                    continue
