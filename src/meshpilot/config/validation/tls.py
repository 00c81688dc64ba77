"""TLS settings: server side (Gateway servers, Sidecar ingress) and client side (DestinationRule)."""

from __future__ import annotations

from typing import Any

from meshpilot._proto.istio.networking.v1alpha3 import destination_rule_pb2, gateway_pb2
from meshpilot.config.validation.formatting import enum_name, go_list, go_quote
from meshpilot.config.validation.report import Report

_ServerTLS = gateway_pb2.ServerTLSSettings
_ClientTLS = destination_rule_pb2.ClientTLSSettings

# What BoringSSL (and so Envoy) knows, from `bssl ciphers -openssl-name ALL`, without PSK suites.
_CIPHER_SUITES = frozenset(
    {
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        "ECDHE-RSA-AES128-GCM-SHA256",
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        "ECDHE-RSA-AES256-GCM-SHA384",
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        "ECDHE-RSA-CHACHA20-POLY1305",
        "ECDHE-ECDSA-AES128-SHA",
        "ECDHE-RSA-AES128-SHA",
        "ECDHE-ECDSA-AES256-SHA",
        "ECDHE-RSA-AES256-SHA",
        "AES128-GCM-SHA256",
        "AES256-GCM-SHA384",
        "AES128-SHA",
        "AES256-SHA",
        "DES-CBC3-SHA",
    }
)


def _is_valid_cipher_suite(suite: str) -> bool:
    if suite in ("", "ALL"):
        return True
    # Cipher-list operators ("-X", "+X", "!X", "[A|B]") are let through rather
    # than parsed. istiod looks at the first byte only.
    first = chr(suite.encode()[0])
    if not (first.isalpha() or first.isnumeric()):
        return True
    return suite in _CIPHER_SUITES


def _check_cipher_suites(tls: Any, report: Report) -> None:
    invalid: set[str] = set()
    seen: set[str] = set()
    duplicates: set[str] = set()
    for suite in tls.cipher_suites:
        if not _is_valid_cipher_suite(suite):
            invalid.add(suite)
        elif suite in seen:
            duplicates.add(suite)
        else:
            seen.add(suite)
    if invalid:
        report.warn(f"ignoring invalid cipher suites: {go_list(sorted(invalid))}")
    if duplicates:
        report.warn(f"ignoring duplicate cipher suites: {go_list(sorted(duplicates))}")


def check_server_tls(tls: Any, report: Report) -> None:
    """A ServerTLSSettings block (Gateway servers and Sidecar ingress listeners)."""
    if tls.min_protocol_version in (_ServerTLS.TLSV1_0, _ServerTLS.TLSV1_1) and not tls.cipher_suites:
        report.warn(
            "TLS version below TLSV1_2 require setting compatible ciphers as by default they no longer "
            "include compatible ciphers."
        )
    _check_cipher_suites(tls, report)

    mode = tls.mode
    if mode == _ServerTLS.ISTIO_MUTUAL:
        # Istio provides the certificates in this mode; nothing else may be configured.
        for present, what in (
            (tls.server_certificate, "server certificate"),
            (tls.private_key, "private key"),
            (tls.ca_certificates, "CA bundle"),
            (tls.tls_certificates, "tlsCertificates"),
            (tls.credential_name, "credentialName"),
            (tls.credential_names, "credentialNames"),
        ):
            if present:
                report.error(f"ISTIO_MUTUAL TLS cannot have associated {what}")
        return

    if mode in (_ServerTLS.PASSTHROUGH, _ServerTLS.AUTO_PASSTHROUGH) and (
        tls.ca_crl
        or tls.server_certificate
        or tls.private_key
        or tls.ca_certificates
        or tls.tls_certificates
        or tls.credential_name
        or tls.credential_names
    ):
        report.warn(f"{enum_name(tls, 'mode')} mode does not use certificates, they will be ignored")

    sources = [
        bool(tls.server_certificate and tls.private_key),
        bool(tls.credential_name),
        bool(tls.credential_names),
        bool(tls.tls_certificates),
    ]
    if sum(sources) > 1:
        report.error(
            "only one of credential_name, credential_names, server_certificate/private_key, "
            "tls_certificates should be specified"
        )

    terminating = mode in (_ServerTLS.SIMPLE, _ServerTLS.MUTUAL, _ServerTLS.OPTIONAL_MUTUAL)
    if terminating and (tls.credential_name or tls.credential_names):
        # The certificates come from the credential; nothing else is required.
        return
    if terminating:
        prefix = "SIMPLE TLS" if mode == _ServerTLS.SIMPLE else "MUTUAL TLS"
        if mode != _ServerTLS.SIMPLE and not tls.ca_certificates:
            report.error(f"{prefix} requires a client CA bundle")
        if len(tls.tls_certificates) > 2:
            report.warn(f"{prefix} can support up to 2 server certificates")
        pairs = (
            [(c.server_certificate, c.private_key) for c in tls.tls_certificates]
            if tls.tls_certificates
            else [(tls.server_certificate, tls.private_key)]
        )
        for certificate, key in pairs:
            if not certificate:
                report.error(f"{prefix} requires a server certificate")
            if not key:
                report.error(f"{prefix} requires a private key")
    if tls.ca_crl:
        if tls.credential_name:
            report.error(
                "CRL is not supported with credentialName. CRL has to be specified in the credential"
            )
        if mode == _ServerTLS.SIMPLE:
            report.error("CRL is not supported with SIMPLE TLS")


_CONFIGMAP_PREFIX = "configmap://"


def _configmap_error(credential_name: str, namespace: str) -> str | None:
    parts = credential_name[len(_CONFIGMAP_PREFIX) :].split("/")
    problem = None
    if len(parts) <= 1:
        problem = f"invalid resource name {go_quote(credential_name)}. Expected namespace and name"
    elif not parts[0]:
        problem = f"invalid resource name {go_quote(credential_name)}. Expected namespace"
    elif not parts[1]:
        problem = f"invalid resource name {go_quote(credential_name)}. Expected name"
    if problem:
        return f"invalid configmap:// credentialName: {problem}"
    # A ConfigMap in another namespace would let one namespace read another's data.
    if parts[0] != namespace or not namespace:
        return (
            "invalid configmap:// credentialName: namespace must match the configuration namespace "
            f"{go_quote(namespace)}"
        )
    return None


def client_tls_errors(namespace: str, tls: Any) -> list[str]:
    """A ClientTLSSettings block (DestinationRule traffic policies, tracing TLS in MeshConfig)."""
    errors = []
    if tls.credential_name.startswith(_CONFIGMAP_PREFIX):
        problem = _configmap_error(tls.credential_name, namespace)
        if problem:
            errors.append(problem)
    mode = tls.mode
    if tls.HasField("insecure_skip_verify") and tls.insecure_skip_verify.value:
        if mode == _ClientTLS.SIMPLE and (
            tls.ca_certificates or tls.credential_name or tls.subject_alt_names
        ):
            errors.append(
                "cannot specify CaCertificates or CredentialName or SubjectAltNames "
                "when InsecureSkipVerify is set true"
            )
        if mode == _ClientTLS.MUTUAL and (tls.ca_certificates or tls.subject_alt_names):
            errors.append(
                "cannot specify CaCertificates or SubjectAltNames when InsecureSkipVerify is set true"
            )
    if mode in (_ClientTLS.SIMPLE, _ClientTLS.MUTUAL) and tls.credential_name:
        if tls.client_certificate or tls.ca_certificates or tls.private_key or tls.ca_crl:
            errors.append(
                "cannot specify client certificates or CA certificate or CA CRL If credentialName is set"
            )
        return errors
    if mode == _ClientTLS.MUTUAL:
        if not tls.client_certificate:
            errors.append("client certificate required for mutual tls")
        if not tls.private_key:
            errors.append("private key required for mutual tls")
    return errors
