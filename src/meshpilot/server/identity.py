"""The identity plane of ``meshpilot discovery``: the mesh CA, istiod's serving certificate and the
secure gRPC server that carries ADS and CreateCertificate (istiod's 15012)."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from prometheus_client import CollectorRegistry

from meshpilot._proto.istio.security.v1alpha1 import ca_pb2_grpc
from meshpilot.ca.authenticate import (
    Authenticator,
    ClientCertificate,
    KubernetesToken,
    kubernetes_token_reviewer,
)
from meshpilot.ca.authority import CertificateAuthority, IPAddress
from meshpilot.ca.keys import load_plugged_files, plugged_files
from meshpilot.ca.mesh_ca import load_authority
from meshpilot.ca.service import CaMetrics, CertificateService
from meshpilot.ca.serving import ServingCertificate, istiod_dns_names
from meshpilot.grpc_bind import bind
from meshpilot.kube.client import KubeError
from meshpilot.server.secure_grpc import server_credentials
from meshpilot.server.settings import Address, DiscoverySettings

log = logging.getLogger(__name__)


class IdentityPlane:
    def __init__(
        self,
        settings: DiscoverySettings,
        trust_domain: Callable[[], str],
        registry: CollectorRegistry,
        kube_api: Any | None,
        *,
        quiet: bool = False,
    ) -> None:
        """``trust_domain`` is read when needed: on Kubernetes, MeshConfig may arrive after start. The
        CA itself is loaded by ``load`` (or ``load_until_ready``, which waits out an API server that is
        not there yet). ``quiet``: another process (a push worker's main) has warned about the set-up."""
        self.settings = settings
        self._trust_domain = trust_domain
        self._registry = registry
        self._kube_api = kube_api
        self._authority: CertificateAuthority | None = None
        self._serving: ServingCertificate | None = None
        self._ca_service: CertificateService | None = None
        authenticators: list[Authenticator] = [ClientCertificate()]
        if kube_api is not None:
            authenticators.append(KubernetesToken(kubernetes_token_reviewer(kube_api), trust_domain))
        elif not quiet:
            log.warning(
                "not on Kubernetes: no service-account token can be reviewed, so the secure port %s "
                "authenticates nobody; callers with a mesh certificate use --secure-grpc-client-cert-addr",
                settings.secure_grpc_addr or "(off)",
            )
        self.authenticators: Sequence[Authenticator] = tuple(authenticators)

    def load(self) -> None:
        """Loads the CA and makes the serving certificate; blocking. KubeError when the API server cannot
        be reached, ConfigError when what it holds (or the files) is wrong."""
        settings = self.settings
        authority, source = load_authority(
            settings.ca, self._trust_domain(), kube=self._kube_api, namespace=settings.istio_namespace
        )
        self.use(authority)
        log.info("mesh CA: %s", source)

    def use(self, authority: CertificateAuthority) -> None:
        """Serve with ``authority``, loaded elsewhere (a push worker's is the main process's)."""
        settings = self.settings
        addresses = [settings.secure_grpc_addr, settings.secure_grpc_client_cert_addr, settings.webhook_addr]
        self._serving = ServingCertificate(
            authority,
            istiod_dns_names(settings.istio_namespace, settings.domain, _hostnames(addresses)),
            ip_addresses=_ips(addresses),
        )
        self._ca_service = CertificateService(authority, self.authenticators, CaMetrics(self._registry))
        self._authority = authority

    async def load_until_ready(self, stop: asyncio.Event) -> bool:
        """``load``, off the event loop, again and again while the API server cannot be reached (at most
        30 s apart); False if ``stop`` came first. A ConfigError (bad CA material) is raised."""
        delay = 0.5
        while not stop.is_set():
            try:
                await asyncio.to_thread(self.load)
                return True
            except KubeError as err:
                log.warning(
                    "cannot load the mesh CA from Kubernetes yet (%s); trying again in %.0fs", err, delay
                )
            try:
                await asyncio.wait_for(stop.wait(), delay)
            except TimeoutError:
                delay = min(delay * 2, 30.0)
        return False

    @property
    def loaded(self) -> bool:
        return self._authority is not None

    @property
    def authority(self) -> CertificateAuthority:
        assert self._authority is not None, "the CA is not loaded yet"
        return self._authority

    @property
    def serving(self) -> ServingCertificate:
        assert self._serving is not None, "the CA is not loaded yet"
        return self._serving

    def files(self) -> dict[str, bytes]:
        """The CA as a plugged-in CA's files (what a push worker is given)."""
        authority = self.authority
        return plugged_files(authority.signer, authority.chain, authority.roots)

    @staticmethod
    def authority_from(files: dict[str, bytes]) -> CertificateAuthority:
        signer, chain, roots = load_plugged_files(files, "the main process's CA")
        return CertificateAuthority(signer, chain, roots)

    @property
    def root_pem(self) -> bytes:
        return self.authority.root_pem.encode()

    def add_ports(self, server: grpc.aio.Server) -> list[str]:
        """Adds CreateCertificate and the secure ports to ``server``; the addresses bound."""
        ca_pb2_grpc.add_IstioCertificateServiceServicer_to_server(  # type: ignore[no-untyped-call]
            self._ca_service, server
        )
        bound: list[str] = []
        for address, roots in (
            (self.settings.secure_grpc_addr, None),
            (self.settings.secure_grpc_client_cert_addr, lambda: self.root_pem),
        ):
            if address is None:
                continue
            credentials = server_credentials(self.serving, client_roots=roots)
            bind(server, address.grpc_target, "secure xDS", credentials, where=str(address))
            bound.append(str(address))
        return bound

    async def run(self, stop: asyncio.Event) -> None:
        await self.serving.run(stop)


def _hostnames(addresses: Sequence[Address | None]) -> tuple[str, ...]:
    names = []
    for address in addresses:
        if address is not None and address.host and not _is_ip(address.host):
            names.append(address.host)
    return ("localhost", *names)


def _ips(addresses: Sequence[Address | None]) -> list[IPAddress]:
    ips: list[IPAddress] = [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")]
    for address in addresses:
        if address is not None and _is_ip(address.host):
            ip = ipaddress.ip_address(address.host)
            if ip not in ips and not ip.is_unspecified:
                ips.append(ip)
    return ips


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
