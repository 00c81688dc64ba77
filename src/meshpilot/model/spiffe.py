"""SPIFFE IDs as Istio spells them: ``spiffe://<trust domain>/ns/<namespace>/sa/<service account>``."""

from __future__ import annotations

import re
from dataclasses import dataclass

_SPIFFE = re.compile(r"spiffe://(?P<td>[^/]+)/ns/(?P<ns>[^/]+)/sa/(?P<sa>[^/]+)")


@dataclass(frozen=True, slots=True)
class SpiffeId:
    trust_domain: str
    namespace: str
    service_account: str

    @classmethod
    def parse(cls, uri: str) -> SpiffeId | None:
        match = _SPIFFE.fullmatch(uri)
        return cls(match["td"], match["ns"], match["sa"]) if match else None

    def __str__(self) -> str:
        return f"spiffe://{self.trust_domain}/ns/{self.namespace}/sa/{self.service_account}"


def spiffe_identity(trust_domain: str, namespace: str, service_account: str) -> str:
    return str(SpiffeId(trust_domain, namespace, service_account))
