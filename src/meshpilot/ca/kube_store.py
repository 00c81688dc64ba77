"""Where the CA's signing key lives on Kubernetes, as istiod keeps it.

In the Istio namespace, in this order:

1. ``cacerts``: a plugged-in CA, istiod's files as Secret keys (``ca-cert.pem``, ``ca-key.pem``,
   ``root-cert.pem``, ``cert-chain.pem``) or a ``kubernetes.io/tls`` Secret's (``tls.crt``,
   ``tls.key``, ``ca.crt``, read as istiod reads them). It is used when it holds any of these keys,
   and must then pass ``load_plugged``'s checks; it is never written.
2. ``istio-ca-secret``: the self-signed root, Secret type ``istio.io/ca-root``, keys ``ca-cert.pem``
   and ``ca-key.pem`` (the root and its key), ``root-cert.pem`` (the root again) and empty
   ``cert-chain.pem`` and ``key.pem``, as istiod's ``BuildSecret`` writes it, so either server reads
   what the other made. Made at the first start and reused after; when two replicas make it at once,
   the API server keeps one (the other's create gets 409) and both sign with that one, as with
   istiod, whose failed create is retried and then reads the winner's. No leader election is needed:
   the create is the one write, and the API server lets only one through.

Bad content is a :class:`ConfigError` naming the Secret and the key, and nothing is written. A
failing API server is a :class:`KubeError`; retrying is the caller's choice.

Where meshpilot differs: istiod refuses a ``cacerts`` without ``cert-chain.pem`` ("incomplete
signing CA bundle"); meshpilot, as for the directory, takes the chain as empty.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import logging
from collections.abc import Mapping
from typing import Any, NamedTuple

import urllib3
from cryptography import x509
from kubernetes import client as kclient
from kubernetes.client.exceptions import ApiException

from meshpilot.ca.keys import (
    CA_CERT,
    CA_KEY,
    CERT_CHAIN,
    ROOT_CERT,
    SigningKey,
    load_plugged_files,
    load_self_signed_files,
    new_self_signed,
)
from meshpilot.config.errors import ConfigError
from meshpilot.kube.client import KubeError

log = logging.getLogger(__name__)

#: istiod's names (``security/pkg/pki/ca``): the plugged-in CA and the kept self-signed root.
CACERTS_SECRET = "cacerts"
CA_SECRET = "istio-ca-secret"
CA_SECRET_TYPE = "istio.io/ca-root"
#: istiod's BuildSecret writes these empty in ``istio-ca-secret``.
PRIVATE_KEY = "key.pem"
#: A ``kubernetes.io/tls`` Secret's keys, which istiod also accepts for the plugged-in CA.
TLS_CERT, TLS_KEY, TLS_ROOT = "tls.crt", "tls.key", "ca.crt"

_PLUGGED_KEYS = (CA_CERT, CA_KEY, ROOT_CERT, CERT_CHAIN)
_REQUEST_TIMEOUT = (5.0, 30.0)
#: Reads after a lost create race: the winner's Secret could be deleted in between, so try again.
_CREATE_ATTEMPTS = 3


class SigningMaterial(NamedTuple):
    """What a CertificateAuthority is made of, and where it came from (for the log)."""

    signer: SigningKey
    chain: tuple[x509.Certificate, ...]
    roots: tuple[x509.Certificate, ...]
    source: str


def load_signing_material(
    api: kclient.ApiClient,
    namespace: str,
    trust_domain: str,
    algorithm: str = "rsa",
    *,
    now: datetime.datetime | None = None,
) -> SigningMaterial:
    """The CA's key from ``cacerts``, else from ``istio-ca-secret`` (made the first time).

    ``trust_domain`` and ``algorithm`` (``rsa`` or ``ecdsa``) only matter when the root is made.
    Blocking: call it from a thread when a loop is running.
    """
    core = kclient.CoreV1Api(api)
    plugged = _read(core, namespace, CACERTS_SECRET)
    if plugged is not None:
        files = _decoded(plugged, namespace, CACERTS_SECRET)
        where = f"Secret {namespace}/{CACERTS_SECRET}"
        if TLS_CERT in files:
            files = _from_tls(files)
            where += f" ({TLS_CERT}, {TLS_KEY}, {TLS_ROOT} read as {CA_CERT}, {CA_KEY}, {ROOT_CERT})"
        if any(files.get(name) for name in _PLUGGED_KEYS):
            signer, chain, roots = load_plugged_files(files, where)
            return SigningMaterial(signer, chain, roots, f"plugged-in CA from Secret {namespace}/cacerts")
        log.warning(
            "Secret %s/%s holds none of %s: not a plugged-in CA, using %s",
            namespace,
            CACERTS_SECRET,
            ", ".join(_PLUGGED_KEYS),
            CA_SECRET,
        )
    for _ in range(_CREATE_ATTEMPTS):
        kept = _read(core, namespace, CA_SECRET)
        if kept is not None:
            signer = _self_signed(kept, namespace)
            return SigningMaterial(
                signer, (), (signer.certificate,), f"self-signed root from Secret {namespace}/{CA_SECRET}"
            )
        signer, files = new_self_signed(trust_domain, algorithm, now)
        if _create(core, namespace, files):
            log.info(
                "made a self-signed root for %s, kept in Secret %s/%s", trust_domain, namespace, CA_SECRET
            )
            return SigningMaterial(
                signer, (), (signer.certificate,), f"self-signed root made in Secret {namespace}/{CA_SECRET}"
            )
        log.info("Secret %s/%s made meanwhile by another replica: using it", namespace, CA_SECRET)
    raise KubeError(
        f"Secret {namespace}/{CA_SECRET}: made and gone again {_CREATE_ATTEMPTS} times; not starting the CA"
    )


def _self_signed(secret: Any, namespace: str) -> SigningKey:
    return load_self_signed_files(_decoded(secret, namespace, CA_SECRET), f"Secret {namespace}/{CA_SECRET}")


def _read(core: kclient.CoreV1Api, namespace: str, name: str) -> Any:
    """The Secret, or None when there is none."""
    try:
        return core.read_namespaced_secret(name, namespace, _request_timeout=_REQUEST_TIMEOUT)
    except ApiException as err:
        if err.status == 404:
            return None
        raise KubeError(f"read Secret {namespace}/{name}: {err.status} {err.reason}", err.status) from None
    except (urllib3.exceptions.HTTPError, OSError) as err:
        raise KubeError(f"read Secret {namespace}/{name}: {err}") from None


def _create(core: kclient.CoreV1Api, namespace: str, files: Mapping[str, bytes]) -> bool:
    """Make ``istio-ca-secret``; False when it exists already (another replica won)."""
    data = {name: files.get(name, b"") for name in (CERT_CHAIN, PRIVATE_KEY, ROOT_CERT, CA_CERT, CA_KEY)}
    body = kclient.V1Secret(
        metadata=kclient.V1ObjectMeta(name=CA_SECRET, namespace=namespace),
        type=CA_SECRET_TYPE,
        data={name: base64.b64encode(value).decode() for name, value in data.items()},
    )
    try:
        core.create_namespaced_secret(namespace, body, _request_timeout=_REQUEST_TIMEOUT)
    except ApiException as err:
        if err.status == 409:
            return False
        raise KubeError(
            f"create Secret {namespace}/{CA_SECRET}: {err.status} {err.reason}", err.status
        ) from None
    except (urllib3.exceptions.HTTPError, OSError) as err:
        raise KubeError(f"create Secret {namespace}/{CA_SECRET}: {err}") from None
    return True


def _decoded(secret: Any, namespace: str, name: str) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for key, value in (secret.data or {}).items():
        try:
            files[key] = base64.b64decode(value or "", validate=True)
        except (binascii.Error, ValueError):
            raise ConfigError(f"Secret {namespace}/{name}: key {key} is not base64") from None
    return files


def _from_tls(files: Mapping[str, bytes]) -> dict[str, bytes]:
    """A ``kubernetes.io/tls`` Secret in istiod's names: ``tls.crt`` signs (with the intermediates
    after it), ``ca.crt`` holds the root."""
    tls_cert, root = files.get(TLS_CERT, b""), files.get(TLS_ROOT, b"")
    return {
        CA_CERT: tls_cert,
        CA_KEY: files.get(TLS_KEY, b""),
        ROOT_CERT: root,
        CERT_CHAIN: tls_cert + (b"\n" + root if root else b""),
    }
