"""The secure gRPC port (istiod's 15012): ADS and the CA over TLS with istiod's serving certificate.

The certificate is read at each handshake from the rotating ``ServingCertificate``, so a renewal
reaches new connections without a restart. Callers prove who they are with a service-account token
(istiod's default for sidecars). grpcio cannot ask for a client certificate without requiring one,
so certificate-authenticated callers get their own port, where a certificate chaining to the mesh
root is required (``--secure-grpc-client-cert-addr``).
"""

from __future__ import annotations

from collections.abc import Callable

import grpc

from meshpilot.ca.serving import ServingCertificate


def _configuration(serving: ServingCertificate, roots: bytes | None) -> grpc.ServerCertificateConfiguration:
    pair = serving.current
    return grpc.ssl_server_certificate_configuration([(pair.key_pem, pair.chain_pem)], roots)


def server_credentials(
    serving: ServingCertificate, *, client_roots: Callable[[], bytes] | None = None
) -> grpc.ServerCredentials:
    """TLS credentials that follow ``serving``'s renewals; ``client_roots`` requires a client
    certificate chaining to those roots."""
    seen = serving.generation

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        # Called by gRPC at each handshake, on its own threads: None keeps the configuration it has.
        nonlocal seen
        if serving.generation == seen:
            return None
        seen = serving.generation
        return _configuration(serving, client_roots() if client_roots else None)

    initial = _configuration(serving, client_roots() if client_roots else None)
    return grpc.dynamic_ssl_server_credentials(
        initial, fetch, require_client_authentication=client_roots is not None
    )
