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
from meshpilot.ca.authority import IPAddress
from meshpilot.ca.mesh_ca import load_authority
from meshpilot.ca.service import CaMetrics, CertificateService
from meshpilot.ca.serving import ServingCertificate, istiod_dns_names
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
    ) -> None:
        """``trust_domain`` is read when needed: on Kubernetes, MeshConfig may arrive after start."""
        self.settings = settings
        self.authority, source = load_authority(
            settings.ca, trust_domain(), kube=kube_api, namespace=settings.istio_namespace
        )
        log.info("mesh CA: %s", source)
        authenticators: list[Authenticator] = [ClientCertificate()]
        if kube_api is not None:
            authenticators.append(KubernetesToken(kubernetes_token_reviewer(kube_api), trust_domain))
        else:
            log.warning(
                "not on Kubernetes: no service-account token can be reviewed, so the secure port %s "
                "authenticates nobody; callers with a mesh certificate use --secure-grpc-client-cert-addr",
                settings.secure_grpc_addr or "(off)",
            )
        self.authenticators: Sequence[Authenticator] = tuple(authenticators)
        addresses = [settings.secure_grpc_addr, settings.secure_grpc_client_cert_addr, settings.webhook_addr]
        self.serving = ServingCertificate(
            self.authority,
            istiod_dns_names(settings.istio_namespace, settings.domain, _hostnames(addresses)),
            ip_addresses=_ips(addresses),
        )
        self.ca_service = CertificateService(self.authority, self.authenticators, CaMetrics(registry))

    @property
    def root_pem(self) -> bytes:
        return self.authority.root_pem.encode()

    def add_ports(self, server: grpc.aio.Server) -> list[str]:
        """Adds CreateCertificate and the secure ports to ``server``; the addresses bound."""
        ca_pb2_grpc.add_IstioCertificateServiceServicer_to_server(  # type: ignore[no-untyped-call]
            self.ca_service, server
        )
        bound: list[str] = []
        for address, roots in (
            (self.settings.secure_grpc_addr, None),
            (self.settings.secure_grpc_client_cert_addr, lambda: self.root_pem),
        ):
            if address is None:
                continue
            if (
                server.add_secure_port(
                    address.grpc_target, server_credentials(self.serving, client_roots=roots)
                )
                == 0
            ):
                raise OSError(f"cannot listen on {address} for secure xDS")
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
