"""Secrets as istiod reads them for SDS: resource names, keys, the -cacert lookup, the store."""

from __future__ import annotations

import base64
import re

import pytest

from meshpilot.config.core_objects import KubeSecret, ObjectMeta, parse_secret
from meshpilot.config.errors import ConfigError
from meshpilot.model.config import ConfigKey
from meshpilot.model.credentials import (
    CredentialError,
    CredentialStore,
    cert_info,
    extract_cert_info,
    extract_root,
    parse_resource_name,
    related_keys,
    to_resource_name,
)
from meshpilot.model.kind import Kind


def _secret(name: str, namespace: str = "default", **data: bytes) -> KubeSecret:
    return KubeSecret(ObjectMeta(name, namespace), data=dict(data))


def test_resource_names_resolve_to_the_proxys_namespace_unless_they_name_one() -> None:
    assert parse_resource_name("kubernetes://tls", "gw").namespace == "gw"
    other = parse_resource_name("kubernetes://other/tls-cacert", "gw")
    assert (other.namespace, other.name, other.ca_only) == ("other", "tls-cacert", True)
    with pytest.raises(CredentialError):
        parse_resource_name("configmap://ns/ca", "gw")
    assert to_resource_name("tls") == "kubernetes://tls"
    assert to_resource_name("kubernetes://ns/tls") == "kubernetes://ns/tls"
    assert to_resource_name("builtin://") == "default"


def test_keys_in_istiods_order_with_its_messages() -> None:
    generic = extract_cert_info({"cert": b"C", "key": b"K", "tls.crt": b"X", "tls.key": b"Y"})
    assert (generic.cert, generic.key) == (b"C", b"K")
    typed = extract_cert_info({"tls.crt": b"X", "tls.key": b"Y", "tls.ocsp-staple": b"S"})
    assert (typed.cert, typed.key, typed.staple) == (b"X", b"Y", b"S")
    with pytest.raises(
        CredentialError, match=re.escape('found keys "tls.crt" and "tls.key", but they were empty')
    ):
        extract_cert_info({"tls.crt": b"", "tls.key": b""})
    with pytest.raises(CredentialError, match=r"didn't have expected keys .* found: a, b, c, and 1 more"):
        extract_cert_info({"a": b"1", "b": b"1", "c": b"1", "d": b"1"})
    assert extract_root({"cacert": b"A", "ca.crt": b"B"}).cert == b"A"
    assert extract_root({"ca.crt": b"B", "ca.crl": b"L"}).crl == b"L"
    with pytest.raises(CredentialError, match=re.escape("expected keys cacert or ca.crt")):
        extract_root({"tls.crt": b"X"})


def test_cacert_reads_its_own_secret_first_then_the_one_without_the_suffix() -> None:
    store = CredentialStore()
    store.upsert(_secret("tls", **{"tls.crt": b"C", "tls.key": b"K", "ca.crt": b"CA"}))
    assert cert_info(store, parse_resource_name("kubernetes://tls-cacert", "default")).cert == b"CA"
    store.upsert(_secret("tls-cacert", cacert=b"OWN"))
    assert cert_info(store, parse_resource_name("kubernetes://tls-cacert", "default")).cert == b"OWN"
    with pytest.raises(CredentialError, match="secret default/missing not found"):
        cert_info(store, parse_resource_name("kubernetes://missing-cacert", "default"))


def test_the_store_reports_changes_of_data_only() -> None:
    changed: list[ConfigKey] = []
    store = CredentialStore(changed.append)
    store.upsert(_secret("tls", cert=b"1"))
    store.upsert(KubeSecret(ObjectMeta("tls", "default", resource_version="2"), data={"cert": b"1"}))
    store.upsert(_secret("tls", cert=b"2"))
    store.remove("default", "tls")
    store.remove("default", "tls")
    assert changed == [ConfigKey(Kind.SECRET, "tls", "default")] * 3
    assert related_keys(ConfigKey(Kind.SECRET, "tls", "ns"))[1].name == "tls-cacert"
    assert related_keys(ConfigKey(Kind.SECRET, "tls-cacert", "ns"))[1].name == "tls"


def test_secrets_decode_from_files_as_from_the_api() -> None:
    raw = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "tls", "namespace": "gw"},
        "type": "kubernetes.io/tls",
        "data": {"tls.crt": base64.b64encode(b"CERT").decode(), "tls.key": base64.b64encode(b"K").decode()},
        "stringData": {"tls.key": "KEY"},
    }
    secret = parse_secret(raw)
    assert secret.type == "kubernetes.io/tls"
    assert secret.data == {"tls.crt": b"CERT", "tls.key": b"KEY"}
    with pytest.raises(ConfigError, match="illegal base64"):
        parse_secret({**raw, "data": {"tls.crt": "!!"}})
