"""TLS contexts for proxyless gRPC, as istiod's grpcgen writes them.

gRPC does not use SDS: it reads certificates from the certificate provider
instances its bootstrap names, and istiod refers to the instance ``default``
for both the workload certificate (``default``) and the roots (``ROOTCA``).
gRPC's xDS client also insists on the transport socket's name being exactly
``envoy.transport_sockets.tls``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2
from envoy.type.matcher.v3 import string_pb2

from meshpilot.networking import names
from meshpilot.networking.protobuf import boolean, pack

TRANSPORT_SOCKET_NAME = "envoy.transport_sockets.tls"
CERTIFICATE_PROVIDER_INSTANCE = "default"


def common_tls_context(sans: Iterable[str] = ()) -> Any:
    """Certificate and roots from the bootstrap's provider; SANs matched exactly, if any."""
    out = tls_pb2.CommonTlsContext()
    # Named twice, as istiod names them: the current fields, and the deprecated ones older gRPC reads.
    for provider, name in (
        (out.tls_certificate_provider_instance, names.SDS_DEFAULT),
        (out.tls_certificate_certificate_provider_instance, names.SDS_DEFAULT),
    ):
        provider.instance_name = CERTIFICATE_PROVIDER_INSTANCE
        provider.certificate_name = name
    combined = out.combined_validation_context
    for provider in (
        combined.default_validation_context.ca_certificate_provider_instance,
        combined.validation_context_certificate_provider_instance,
    ):
        provider.instance_name = CERTIFICATE_PROVIDER_INSTANCE
        provider.certificate_name = names.SDS_ROOTCA
    # gRPC reads the exact-match list (typed SAN matchers are Envoy's newer form).
    combined.default_validation_context.match_subject_alt_names.extend(
        string_pb2.StringMatcher(exact=san) for san in sans
    )
    return out


def upstream_transport_socket(sans: Iterable[str]) -> Any:
    """ISTIO_MUTUAL towards a server: the client certificate and the server's SANs."""
    context = tls_pb2.UpstreamTlsContext(common_tls_context=common_tls_context(sans))
    return base_pb2.TransportSocket(name=TRANSPORT_SOCKET_NAME, typed_config=pack(context))


def downstream_transport_socket() -> Any:
    """mTLS on a gRPC server: a client certificate is required (gRPC checks no SANs here)."""
    context = tls_pb2.DownstreamTlsContext(
        common_tls_context=common_tls_context(), require_client_certificate=boolean(True)
    )
    return base_pb2.TransportSocket(name=TRANSPORT_SOCKET_NAME, typed_config=pack(context))
