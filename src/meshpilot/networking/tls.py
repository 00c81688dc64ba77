"""TLS contexts of in-mesh mutual TLS, with certificates from the proxy's SDS."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from envoy.config.core.v3 import base_pb2, config_source_pb2, grpc_service_pb2, proxy_protocol_pb2
from envoy.extensions.transport_sockets.proxy_protocol.v3 import upstream_proxy_protocol_pb2
from envoy.extensions.transport_sockets.raw_buffer.v3 import raw_buffer_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, secret_pb2, tls_pb2
from envoy.type.matcher.v3 import string_pb2

from meshpilot.networking.names import SDS_CLUSTER, SDS_DEFAULT, SDS_ROOTCA
from meshpilot.networking.protobuf import boolean, duration, pack

TLS_TRANSPORT_SOCKET = "envoy.transport_sockets.tls"
RAW_BUFFER_TRANSPORT_SOCKET = "envoy.transport_sockets.raw_buffer"
PROXY_PROTOCOL_TRANSPORT_SOCKET = "envoy.transport_sockets.upstream_proxy_protocol"

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


def proxy_protocol_socket(version: int, inner: Any) -> Any:
    """``inner`` behind a PROXY protocol header of ``version`` (DestinationRule V1 0, V2 1, as Envoy's)."""
    config = upstream_proxy_protocol_pb2.ProxyProtocolUpstreamTransport(
        config=proxy_protocol_pb2.ProxyProtocolConfig(version=version), transport_socket=inner
    )
    return base_pb2.TransportSocket(name=PROXY_PROTOCOL_TRANSPORT_SOCKET, typed_config=pack(config))


def raw_buffer_transport_socket() -> Any:
    return base_pb2.TransportSocket(
        name=RAW_BUFFER_TRANSPORT_SOCKET, typed_config=pack(raw_buffer_pb2.RawBuffer())
    )


#: SDS resource names pilot-agent serves from files named in a DestinationRule.
FILE_CERT_PREFIX = "file-cert:"
FILE_ROOT_PREFIX = "file-root:"
#: The CA bundle name meaning "the system's trusted roots" when a rule names none.
SYSTEM_ROOTS = "system"


class TlsSettingsError(ValueError):
    """A DestinationRule TLS setting that cannot be turned into an upstream context."""


def originated_upstream(tls: Any, sans: Iterable[str], mesh: Any, *, http2: bool, mutual: bool) -> Any:
    """UpstreamTlsContext of SIMPLE or MUTUAL TLS origination (istiod's constructUpstreamTLS).

    Certificates come from files the rule names, served by the proxy's agent
    over SDS (``file-cert:<cert>~<key>``, ``file-root:<ca>``); without a CA the
    system roots are used. ``sans`` are checked exactly unless
    ``insecureSkipVerify``. TlsSettingsError for MUTUAL without a certificate and key.
    """
    common = tls_pb2.CommonTlsContext(
        tls_params=common_pb2.TlsParameters(
            tls_minimum_protocol_version=common_pb2.TlsParameters.TLSv1_2,
            tls_maximum_protocol_version=common_pb2.TlsParameters.TLSv1_3,
        )
    )
    if mutual:
        if not tls.client_certificate or not tls.private_key:
            raise TlsSettingsError("client certificate and private key must not be empty")
        name = f"{FILE_CERT_PREFIX}{tls.client_certificate}~{tls.private_key}"
        common.tls_certificate_sds_secret_configs.append(sds_secret(name))
    if tls.HasField("insecure_skip_verify") and tls.insecure_skip_verify.value:
        common.validation_context.SetInParent()
    else:
        # istiod writes the deprecated exact matchers here: SANs of external servers are
        # usually DNS names, which the typed URI matchers of in-mesh mTLS would not match.
        validation = common_pb2.CertificateValidationContext(
            match_subject_alt_names=[string_pb2.StringMatcher(exact=san) for san in sans]
        )
        if tls.ca_crl:
            validation.crl.filename = tls.ca_crl
        combined = common.combined_validation_context
        combined.default_validation_context.CopyFrom(validation)
        combined.validation_context_sds_secret_config.CopyFrom(
            sds_secret(FILE_ROOT_PREFIX + (tls.ca_certificates or SYSTEM_ROOTS))
        )
    defaults = mesh.tls_defaults
    if defaults.ecdh_curves:
        common.tls_params.ecdh_curves.extend(defaults.ecdh_curves)
    if defaults.cipher_suites:
        common.tls_params.cipher_suites.extend(defaults.cipher_suites)
    if http2:
        common.alpn_protocols.append("h2")
    return tls_pb2.UpstreamTlsContext(sni=tls.sni, common_tls_context=common)


def auto_sni_options(tls: Any, http_options: Any) -> None:
    """Without an explicit SNI, Envoy sends the request's host as SNI and checks the certificate for it."""
    if tls.sni:
        return
    upstream = http_options.upstream_http_protocol_options
    upstream.auto_sni = True
    skip = tls.HasField("insecure_skip_verify") and tls.insecure_skip_verify.value
    if not tls.subject_alt_names and not skip:
        upstream.auto_san_validation = True
