"""Which CA ``meshpilot discovery`` signs with, chosen at start as istiod chooses it.

In order: a plugged-in CA in ``ROOT_CA_DIR`` (istiod's ``cacerts`` files, default ``./etc/cacerts``);
on Kubernetes, the ``cacerts`` Secret, else the self-signed root kept in the ``istio-ca-secret``
Secret of the Istio namespace (made at first start); off Kubernetes, the self-signed root kept in
``--self-signed-ca-dir``; with neither, a root made for this run only, with a warning, since every
certificate it issued stops being trusted at restart.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshpilot.ca.authority import CertificateAuthority
from meshpilot.ca.keys import (
    CA_CERT,
    CA_KEY,
    SigningKey,
    load_or_create_self_signed,
    load_plugged,
    new_key,
    self_signed_root,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CaSettings:
    #: istiod's ROOT_CA_DIR: a plugged-in CA's files, used when ``ca-key.pem`` is there.
    root_ca_dir: Path = Path("./etc/cacerts")
    #: Where a self-signed root is kept when not on Kubernetes; None keeps it in memory.
    self_signed_dir: Path | None = None
    #: Key of a self-signed root: ``rsa`` (2048, istiod's default) or ``ecdsa`` (P-256).
    algorithm: str = "rsa"


def load_authority(
    settings: CaSettings, trust_domain: str, *, kube: Any | None = None, namespace: str = "istio-system"
) -> tuple[CertificateAuthority, str]:
    """The CA and where its key came from (for the start-up log)."""
    plugged = settings.root_ca_dir
    if (plugged / CA_KEY).is_file() or (plugged / CA_CERT).is_file():
        signer, chain, roots = load_plugged(plugged)
        return CertificateAuthority(signer, chain, roots), f"plugged-in CA from {plugged}"
    if kube is not None:
        from meshpilot.ca.kube_store import load_signing_material

        # A KubeError (the API server not reachable, the namespace not there yet) goes to the caller,
        # which tries again; bad content in the Secrets is a ConfigError.
        signer, chain, roots, source = load_signing_material(
            kube, namespace, trust_domain, settings.algorithm
        )
        return CertificateAuthority(signer, tuple(chain), tuple(roots)), source
    if settings.self_signed_dir is not None:
        signer = load_or_create_self_signed(settings.self_signed_dir, trust_domain, settings.algorithm)
        return _self_signed(signer), f"self-signed root kept in {settings.self_signed_dir}"
    log.warning(
        "no plugged-in CA, no Kubernetes and no --self-signed-ca-dir: the mesh root lives only as "
        "long as this process, and certificates it issued are not trusted after a restart"
    )
    key = new_key(settings.algorithm)
    root = self_signed_root(trust_domain, key, datetime.datetime.now(datetime.UTC))
    return _self_signed(SigningKey(key, root)), "self-signed root in memory"


def _self_signed(signer: SigningKey) -> CertificateAuthority:
    return CertificateAuthority(signer, (), (signer.certificate,))
