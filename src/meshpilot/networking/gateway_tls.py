"""The TLS a gateway terminates: a server's DownstreamTlsContext, its SNI hosts and its route name.

istiod's BuildListenerTLSContext (``core/listener.go``) and ``security/model``:

* ALPN ``h2``, ``http/1.1`` (with ``istio-peer-exchange`` first on a TCP
  server terminating ISTIO_MUTUAL, when the proxy has the exchange filter);
* a client certificate is required for MUTUAL and ISTIO_MUTUAL, asked for
  and checked if given for OPTIONAL_MUTUAL, not asked for SIMPLE;
* ISTIO_MUTUAL: the proxy's workload certificate and mesh root (``default``,
  ``ROOTCA`` from its agent), the server's SANs checked;
* ``credentialName(s)``: the Secrets over SDS on ADS (``credential_tls``);
* files (``serverCertificate``/``privateKey``/``caCertificates`` or
  ``tlsCertificates``): served by the proxy's agent as ``file-cert:<cert>~<key>``
  and ``file-root:<ca>`` (``default``/``ROOTCA`` when a path is missing);
* SIMPLE, MUTUAL, OPTIONAL_MUTUAL take MeshConfig's TLS defaults, then the
  server's protocol versions and cipher suites.
"""

from __future__ import annotations

from typing import Any

from envoy.extensions.transport_sockets.tls.v3 import common_pb2, tls_pb2
from envoy.type.matcher.v3 import string_pb2

from meshpilot.model.gateways import GatewayServer
from meshpilot.model.proxy import Proxy
from meshpilot.networking import extensions
from meshpilot.networking.credential_tls import apply_server_credential
from meshpilot.networking.names import SDS_DEFAULT, SDS_ROOTCA
from meshpilot.networking.protobuf import boolean
from meshpilot.networking.tls import FILE_CERT_PREFIX, FILE_ROOT_PREFIX, sds_secret

#: The modes in which the gateway terminates the TLS itself.
TERMINATING = frozenset({"SIMPLE", "MUTUAL", "OPTIONAL_MUTUAL", "ISTIO_MUTUAL"})
_SIMPLE_OR_MUTUAL = frozenset({"SIMPLE", "MUTUAL", "OPTIONAL_MUTUAL"})
_HTTP_ALPN = ["h2", "http/1.1"]
#: istiod's ServerTLSSettings.TLSProtocol enum matches Envoy's TlsParameters one by number.
_TLS_AUTO = 0


def https_route_name(server: GatewayServer) -> str:
    """istiod's RDS name of an HTTPS server that terminates TLS: the Gateway's port (not the one
    listened on), the port's name, the Gateway's name and namespace, then the bind if any."""
    bind = f".{server.bind}" if server.bind else ""
    gateway = server.gateway
    return f"https.{server.port}.{server.port_name}.{gateway.name}.{gateway.namespace}{bind}"


def sni_hosts(server: GatewayServer) -> list[str]:
    """The server's hosts without their namespaces, sorted, once each; none when one is ``*``
    (istiod's filter chain then matches every name)."""
    hosts = sorted({h.host for h in server.hosts})
    return [] if "*" in hosts else hosts


def _file_secret(resource: str, fallback: str) -> Any:
    """A file the agent serves, else ``fallback``; as istiod, only ``default`` and ``ROOTCA`` wait
    for their first fetch without end (``initial_fetch_timeout: 0s``)."""
    config = sds_secret(resource or fallback)
    if resource:
        config.sds_config.ClearField("initial_fetch_timeout")
    return config


def _apply_files(common: Any, tls: Any, validate_client: bool) -> None:
    """Certificates from files the proxy's agent serves (istiod's ApplyToCommonTLSContext)."""
    ca = tls.ca_certificates
    pairs = [(c.server_certificate, c.private_key) for c in tls.tls_certificates] or [
        (tls.server_certificate, tls.private_key)
    ]
    for cert, key in pairs:
        name = f"{FILE_CERT_PREFIX}{cert}~{key}" if cert and key else ""
        common.tls_certificate_sds_secret_configs.append(_file_secret(name, SDS_DEFAULT))
    if validate_client:
        _combined(common, tls, _file_secret(f"{FILE_ROOT_PREFIX}{ca}" if ca else "", SDS_ROOTCA))


def _combined(common: Any, tls: Any, root: Any) -> None:
    validation = common_pb2.CertificateValidationContext(
        match_subject_alt_names=[string_pb2.StringMatcher(exact=n) for n in tls.subject_alt_names]
    )
    if tls.ca_crl:
        validation.crl.filename = tls.ca_crl
    if tls.HasField("insecure_skip_verify") and tls.insecure_skip_verify.value:
        validation.trust_chain_verification = common_pb2.CertificateValidationContext.ACCEPT_UNTRUSTED
    combined = common.combined_validation_context
    combined.default_validation_context.CopyFrom(validation)
    combined.validation_context_sds_secret_config.CopyFrom(root)


def _apply_versions(common: Any, tls: Any, mesh: Any) -> None:
    """MeshConfig's TLS defaults, then the server's own: TlsParameters only when one is set."""
    defaults = mesh.tls_defaults
    if defaults.ecdh_curves:
        common.tls_params.ecdh_curves[:] = list(defaults.ecdh_curves)
    if defaults.cipher_suites:
        common.tls_params.cipher_suites[:] = list(defaults.cipher_suites)
    if defaults.min_protocol_version != _TLS_AUTO:
        common.tls_params.tls_minimum_protocol_version = defaults.min_protocol_version
    if tls.min_protocol_version != _TLS_AUTO:
        common.tls_params.tls_minimum_protocol_version = tls.min_protocol_version
    if tls.cipher_suites:
        common.tls_params.cipher_suites[:] = list(tls.cipher_suites)
    if tls.max_protocol_version != _TLS_AUTO:
        common.tls_params.tls_maximum_protocol_version = tls.max_protocol_version


def downstream_context(proxy: Proxy, server: GatewayServer, mesh: Any, *, tcp: bool) -> Any:
    """The DownstreamTlsContext of a server terminating TLS (``tcp``: a TLS server, not HTTPS)."""
    tls = server.tls
    mode = server.tls_mode
    alpn = list(_HTTP_ALPN)
    if tcp and mode == "ISTIO_MUTUAL":
        alpn = extensions.mtls_server_tcp_alpn(proxy)
    require = mode in ("MUTUAL", "ISTIO_MUTUAL")
    context = tls_pb2.DownstreamTlsContext(
        common_tls_context=tls_pb2.CommonTlsContext(alpn_protocols=alpn),
        require_client_certificate=boolean(require),
    )
    common = context.common_tls_context
    validate_client = require or mode == "OPTIONAL_MUTUAL"
    if mode == "ISTIO_MUTUAL":
        common.tls_certificate_sds_secret_configs.append(sds_secret(SDS_DEFAULT))
        _combined(common, tls, sds_secret(SDS_ROOTCA))
    elif tls.credential_names or tls.credential_name:
        apply_server_credential(common, tls)
    else:
        _apply_files(common, tls, validate_client)
    if mode in _SIMPLE_OR_MUTUAL:
        _apply_versions(common, tls, mesh)
    return context
