"""TLS contexts of in-mesh mutual TLS, with certificates from the proxy's SDS."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from envoy.config.core.v3 import base_pb2, config_source_pb2, grpc_service_pb2
from envoy.extensions.transport_sockets.raw_buffer.v3 import raw_buffer_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, secret_pb2, tls_pb2
from envoy.type.matcher.v3 import string_pb2

from meshpilot.networking.names import SDS_CLUSTER, SDS_DEFAULT, SDS_ROOTCA
from meshpilot.networking.protobuf import boolean, duration, pack

TLS_TRANSPORT_SOCKET = "envoy.transport_sockets.tls"
RAW_BUFFER_TRANSPORT_SOCKET = "envoy.transport_sockets.raw_buffer"

INBOUND_CIPHER_SUITES = [
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256",
    "AES256-GCM-SHA384",
    "AES128-GCM-SHA256",
]


def sds_secret(name: str) -> Any:
    """A secret the proxy's agent serves on the bootstrap cluster ``sds-grpc``."""
    return secret_pb2.SdsSecretConfig(
        name=name,
        sds_config=config_source_pb2.ConfigSource(
            api_config_source=config_source_pb2.ApiConfigSource(
                api_type=config_source_pb2.ApiConfigSource.GRPC,
                set_node_on_first_message_only=True,
                transport_api_version=config_source_pb2.V3,
                grpc_services=[
                    grpc_service_pb2.GrpcService(
                        envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(cluster_name=SDS_CLUSTER)
                    )
                ],
            ),
            initial_fetch_timeout=duration(0),
            resource_api_version=config_source_pb2.V3,
        ),
    )


def _uri_san(matcher: Any) -> Any:
    # Typed URI matchers: istiod still writes the deprecated match_subject_alt_names,
    # which Envoy warns about; the typed form checks the same SPIFFE URI SAN.
    return common_pb2.SubjectAltNameMatcher(san_type=common_pb2.SubjectAltNameMatcher.URI, matcher=matcher)


def _mesh_common_context(alpn: list[str], san_matchers: list[Any]) -> Any:
    return tls_pb2.CommonTlsContext(
        tls_params=common_pb2.TlsParameters(
            tls_minimum_protocol_version=common_pb2.TlsParameters.TLSv1_2,
            tls_maximum_protocol_version=common_pb2.TlsParameters.TLSv1_3,
        ),
        alpn_protocols=alpn,
        tls_certificate_sds_secret_configs=[sds_secret(SDS_DEFAULT)],
        combined_validation_context=tls_pb2.CommonTlsContext.CombinedCertificateValidationContext(
            default_validation_context=common_pb2.CertificateValidationContext(
                match_typed_subject_alt_names=[_uri_san(m) for m in san_matchers]
            ),
            validation_context_sds_secret_config=sds_secret(SDS_ROOTCA),
        ),
    )


def istio_mutual_upstream(sni: str, sans: Iterable[str], alpn: list[str]) -> Any:
    """UpstreamTlsContext of ISTIO_MUTUAL: workload certificate, SPIFFE SANs checked exactly."""
    matchers = [string_pb2.StringMatcher(exact=san) for san in sans]
    return tls_pb2.UpstreamTlsContext(sni=sni, common_tls_context=_mesh_common_context(alpn, matchers))


def istio_mutual_downstream(trust_domains: Iterable[str], alpn: list[str]) -> Any:
    """DownstreamTlsContext of an inbound mTLS chain: any workload of the trust domains."""
    matchers = [string_pb2.StringMatcher(prefix=f"spiffe://{td}/") for td in trust_domains]
    common = _mesh_common_context(alpn, matchers)
    common.tls_params.cipher_suites.extend(INBOUND_CIPHER_SUITES)
    return tls_pb2.DownstreamTlsContext(require_client_certificate=boolean(True), common_tls_context=common)


def tls_transport_socket(context: Any) -> Any:
    return base_pb2.TransportSocket(name=TLS_TRANSPORT_SOCKET, typed_config=pack(context))


def raw_buffer_transport_socket() -> Any:
    return base_pb2.TransportSocket(
        name=RAW_BUFFER_TRANSPORT_SOCKET, typed_config=pack(raw_buffer_pb2.RawBuffer())
    )
