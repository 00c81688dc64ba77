"""TLS credentials from Secrets, as istiod reads them for SDS (``credentialName``).

A resource name is ``kubernetes://[<namespace>/]<name>``; a name without a
namespace is in the namespace of the proxy asking (istiod's
``ParseResourceName``). A name ending in ``-cacert`` asks only for the CA
certificate: it is read from the Secret of that name if there is one, else
from the Secret without the suffix. A credentialName without a scheme is
``kubernetes://`` (``to_resource_name``).

Keys, in istiod's order: the generic ``cert``/``key`` (with ``crl``), else
``tls.crt``/``tls.key`` (with ``tls.ocsp-staple`` and ``ca.crl``); the CA is
``cacert`` (with ``crl``), else ``ca.crt`` (with ``ca.crl``). Errors carry
istiod's messages.

:class:`CredentialStore` holds the Secrets (from Kubernetes and the config
directory) and tells a listener which one changed. It is plain data, read by
the SDS generator through :class:`CredentialReader`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from meshpilot.config.core_objects import KubeSecret
from meshpilot.model.config import ConfigKey
from meshpilot.model.kind import Kind

KUBERNETES_SECRET_URI = "kubernetes://"
CONFIGMAP_URI = "configmap://"
KUBERNETES_GATEWAY_URI = "kubernetes-gateway://"
BUILTIN_URI = "builtin://"
INVALID_URI = "invalid://"
#: The suffix of a resource naming only a Secret's CA certificate.
CA_SUFFIX = "-cacert"

GENERIC_CERT, GENERIC_KEY, GENERIC_CA, GENERIC_CRL = "cert", "key", "cacert", "crl"
TLS_CERT, TLS_KEY, TLS_CA, TLS_CRL, TLS_OCSP = "tls.crt", "tls.key", "ca.crt", "ca.crl", "tls.ocsp-staple"


class CredentialError(Exception):
    """A resource that cannot be served: a bad name, a missing Secret, missing keys."""


@dataclass(frozen=True, slots=True)
class SecretResource:
    """One SDS resource name, resolved: the Secret it reads and whether only its CA."""

    #: The name as the proxy asked for it; the response carries it back.
    resource_name: str
    namespace: str
    name: str

    @property
    def ca_only(self) -> bool:
        return self.name.endswith(CA_SUFFIX)

    @property
    def key(self) -> ConfigKey:
        return ConfigKey(Kind.SECRET, self.name, self.namespace)


@dataclass(frozen=True, slots=True)
class CertInfo:
    cert: bytes
    key: bytes = b""
    staple: bytes = b""
    crl: bytes = b""


def to_resource_name(credential_name: str) -> str:
    """The SDS resource name of a ``credentialName`` (istiod's ToResourceName)."""
    if credential_name.startswith(BUILTIN_URI):
        return "default"
    if credential_name.startswith(INVALID_URI):
        return INVALID_URI
    if credential_name.startswith((CONFIGMAP_URI, KUBERNETES_SECRET_URI, KUBERNETES_GATEWAY_URI)):
        return credential_name
    return KUBERNETES_SECRET_URI + credential_name


def parse_resource_name(resource_name: str, proxy_namespace: str) -> SecretResource:
    """A ``kubernetes://`` resource; CredentialError for the types meshpilot does not serve."""
    if not resource_name.startswith(KUBERNETES_SECRET_URI):
        raise CredentialError(f"unsupported resource name {resource_name!r}: only kubernetes:// is served")
    rest = resource_name[len(KUBERNETES_SECRET_URI) :]
    parts = rest.split("/")
    namespace, name = (parts[0], parts[1]) if len(parts) > 1 else (proxy_namespace, parts[0])
    return SecretResource(resource_name, namespace, name)


def related_keys(key: ConfigKey) -> tuple[ConfigKey, ConfigKey]:
    """A Secret and its ``-cacert`` twin: a change of either may change both resources (istiod's
    relatedConfigs)."""
    if key.name.endswith(CA_SUFFIX):
        return key, ConfigKey(key.kind, key.name[: -len(CA_SUFFIX)], key.namespace)
    return key, ConfigKey(key.kind, key.name + CA_SUFFIX, key.namespace)


def _has_value(data: Mapping[str, bytes], *keys: str) -> bool:
    return all(data.get(k) for k in keys)


def _has_keys(data: Mapping[str, bytes], *keys: str) -> bool:
    return all(k in data for k in keys)


def _found(data: Mapping[str, bytes]) -> str:
    keys = sorted(data)
    if len(keys) < 3:
        return ", ".join(keys)
    return f"{', '.join(keys[:3])}, and {len(keys) - 3} more..."


def extract_cert_info(data: Mapping[str, bytes]) -> CertInfo:
    """The certificate and key of a Secret (istiod's ExtractCertInfo)."""
    if _has_value(data, GENERIC_CERT, GENERIC_KEY):
        return CertInfo(data[GENERIC_CERT], data[GENERIC_KEY], crl=data.get(GENERIC_CRL, b""))
    if _has_value(data, TLS_CERT, TLS_KEY):
        return CertInfo(
            data[TLS_CERT], data[TLS_KEY], staple=data.get(TLS_OCSP, b""), crl=data.get(TLS_CRL, b"")
        )
    if _has_keys(data, GENERIC_CERT, GENERIC_KEY):
        raise CredentialError(f'found keys "{GENERIC_CERT}" and "{GENERIC_KEY}", but they were empty')
    if _has_keys(data, TLS_CERT, TLS_KEY):
        raise CredentialError(f'found keys "{TLS_CERT}" and "{TLS_KEY}", but they were empty')
    raise CredentialError(
        f"found secret, but didn't have expected keys ({GENERIC_CERT} and {GENERIC_KEY}) or "
        f"({TLS_CERT} and {TLS_KEY}); found: {_found(data)}"
    )


def extract_root(data: Mapping[str, bytes]) -> CertInfo:
    """The CA certificate of a Secret (istiod's ExtractRoot)."""
    if _has_value(data, GENERIC_CA):
        return CertInfo(data[GENERIC_CA], crl=data.get(GENERIC_CRL, b""))
    if _has_value(data, TLS_CA):
        return CertInfo(data[TLS_CA], crl=data.get(TLS_CRL, b""))
    if _has_keys(data, GENERIC_CA):
        raise CredentialError(f'found key "{GENERIC_CA}", but it was empty')
    if _has_keys(data, TLS_CA):
        raise CredentialError(f'found key "{TLS_CA}", but it was empty')
    raise CredentialError(
        f"found secret, but didn't have expected keys {GENERIC_CA} or {TLS_CA}; found: {_found(data)}"
    )


class SecretAccess(Protocol):
    """Whether a service account may read the private keys of its namespace's Secrets."""

    def check(self, service_account: str, namespace: str) -> str | None:
        """ "" when allowed, the reason when denied, None while not known yet."""


class CredentialReader(Protocol):
    """What the SDS generator reads: Secrets by namespace and name."""

    def get(self, namespace: str, name: str) -> KubeSecret | None: ...


def cert_info(reader: CredentialReader, resource: SecretResource) -> CertInfo:
    """What ``resource`` serves: the CA of a ``-cacert`` name (from the Secret of that name, else the
    one without the suffix, as istiod's GetCaCert), else the certificate and key."""
    if resource.ca_only:
        secret = reader.get(resource.namespace, resource.name)
        if secret is None:
            stripped = resource.name[: -len(CA_SUFFIX)]
            secret = reader.get(resource.namespace, stripped)
            if secret is None:
                raise CredentialError(f"secret {resource.namespace}/{stripped} not found")
        return extract_root(secret.data)
    secret = reader.get(resource.namespace, resource.name)
    if secret is None:
        raise CredentialError(f"secret {resource.namespace}/{resource.name} not found")
    return extract_cert_info(secret.data)


class CredentialStore:
    """The Secrets SDS may serve, by namespace and name; ``on_change`` hears of every change."""

    def __init__(self, on_change: Callable[[ConfigKey], None] | None = None) -> None:
        self._secrets: dict[tuple[str, str], KubeSecret] = {}
        self.on_change = on_change

    def get(self, namespace: str, name: str) -> KubeSecret | None:
        return self._secrets.get((namespace, name))

    def __len__(self) -> int:
        return len(self._secrets)

    def upsert(self, secret: KubeSecret) -> None:
        key = (secret.meta.namespace, secret.meta.name)
        old = self._secrets.get(key)
        self._secrets[key] = secret
        # Only what SDS serves matters: a resourceVersion alone changes nothing.
        if old is None or old.data != secret.data:
            self._changed(secret.meta.namespace, secret.meta.name)

    def remove(self, namespace: str, name: str) -> None:
        if self._secrets.pop((namespace, name), None) is not None:
            self._changed(namespace, name)

    def _changed(self, namespace: str, name: str) -> None:
        if self.on_change is not None:
            self.on_change(ConfigKey(Kind.SECRET, name, namespace))
