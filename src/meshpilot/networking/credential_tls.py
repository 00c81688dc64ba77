"""TLS contexts whose certificates come from Secrets named by ``credentialName``, over SDS on ADS.

istiod's shapes (``security/model``: ConstructSdsSecretConfigForCredential,
ApplyCustomSDSToClientCommonTLSContext, ApplyCredentialSDSToServerCommonTLSContext):
the certificate is the SDS resource ``kubernetes://<name>`` and the CA that
validates the peer is ``kubernetes://<name>-cacert``, both asked for on the
ADS stream itself (``ads: {}``) with Envoy's default initial fetch timeout, so
a Secret that does not exist delays the listener or cluster, then leaves it
without a certificate: handshakes fail, nothing is sent in plaintext.
"""

from __future__ import annotations

from typing import Any

from envoy.config.core.v3 import config_source_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, secret_pb2, tls_pb2
from envoy.type.matcher.v3 import string_pb2

from meshpilot.model.credentials import BUILTIN_URI, CA_SUFFIX, to_resource_name
from meshpilot.networking.names import SDS_DEFAULT, SDS_ROOTCA
from meshpilot.networking.tls import sds_secret


def ads_secret(credential_name: str) -> Any:
    """The SdsSecretConfig of a credentialName (``builtin://`` is the workload certificate)."""
    # Any builtin:// name is the proxy's own certificate (to_resource_name says so too), from the agent.
    if credential_name.startswith(BUILTIN_URI):
        return sds_secret(SDS_ROOTCA if credential_name.endswith(CA_SUFFIX) else SDS_DEFAULT)
    return secret_pb2.SdsSecretConfig(
        name=to_resource_name(credential_name),
        sds_config=config_source_pb2.ConfigSource(
            ads=config_source_pb2.AggregatedConfigSource(), resource_api_version=config_source_pb2.V3
        ),
    )


def _exact(names: Any) -> list[Any]:
    return [string_pb2.StringMatcher(exact=n) for n in names]


def apply_client_credential(common: Any, tls: Any) -> None:
    """A DestinationRule's credentialName on an upstream context: the client certificate for MUTUAL,
    the Secret's CA (``-cacert``) and the SANs for validation unless ``insecureSkipVerify``."""
    if tls.mode == tls.MUTUAL:
        del common.tls_certificate_sds_secret_configs[:]
        common.tls_certificate_sds_secret_configs.append(ads_secret(tls.credential_name))
    if tls.HasField("insecure_skip_verify") and tls.insecure_skip_verify.value:
        return
    combined = common.combined_validation_context
    combined.default_validation_context.CopyFrom(
        common_pb2.CertificateValidationContext(match_subject_alt_names=_exact(tls.subject_alt_names))
    )
    combined.validation_context_sds_secret_config.CopyFrom(ads_secret(tls.credential_name + CA_SUFFIX))


def apply_server_credential(common: Any, tls: Any) -> None:
    """A Gateway server's credentialName(s) on a downstream context (istiod's
    ApplyCredentialSDSToServerCommonTLSContext): one certificate per name, the first name's (or
    ``caCertCredentialName``'s) CA for MUTUAL and OPTIONAL_MUTUAL, else SAN checks only if named."""
    names = list(tls.credential_names) or [tls.credential_name]
    ca = names[0] + CA_SUFFIX
    common.tls_certificate_sds_secret_configs.extend(ads_secret(n) for n in names)
    if tls.ca_cert_credential_name:
        ca = tls.ca_cert_credential_name
    if tls.mode in (tls.MUTUAL, tls.OPTIONAL_MUTUAL):
        validation = common_pb2.CertificateValidationContext(
            match_subject_alt_names=_exact(tls.subject_alt_names),
            verify_certificate_spki=list(tls.verify_certificate_spki),
            verify_certificate_hash=list(tls.verify_certificate_hash),
        )
        if tls.HasField("insecure_skip_verify") and tls.insecure_skip_verify.value:
            validation.trust_chain_verification = common_pb2.CertificateValidationContext.ACCEPT_UNTRUSTED
        combined = common.combined_validation_context
        combined.default_validation_context.CopyFrom(validation)
        combined.validation_context_sds_secret_config.CopyFrom(ads_secret(ca))
    elif tls.subject_alt_names:
        common.validation_context.CopyFrom(
            common_pb2.CertificateValidationContext(match_subject_alt_names=_exact(tls.subject_alt_names))
        )


def credential_upstream(tls: Any, sans: list[str], mesh: Any, *, http2: bool) -> Any:
    """UpstreamTlsContext of SIMPLE or MUTUAL origination with a credentialName (istiod's
    constructUpstreamTLS, credential branch); ``sans`` are the rule's, or a ServiceEntry's."""
    common = tls_pb2.CommonTlsContext(
        tls_params=common_pb2.TlsParameters(
            tls_minimum_protocol_version=common_pb2.TlsParameters.TLSv1_2,
            tls_maximum_protocol_version=common_pb2.TlsParameters.TLSv1_3,
        )
    )
    effective = type(tls)()
    effective.CopyFrom(tls)
    del effective.subject_alt_names[:]
    effective.subject_alt_names.extend(sans)
    apply_client_credential(common, effective)
    defaults = mesh.tls_defaults
    if defaults.ecdh_curves:
        common.tls_params.ecdh_curves.extend(defaults.ecdh_curves)
    if defaults.cipher_suites:
        common.tls_params.cipher_suites.extend(defaults.cipher_suites)
    if http2:
        common.alpn_protocols.append("h2")
    return tls_pb2.UpstreamTlsContext(sni=tls.sni, common_tls_context=common)
