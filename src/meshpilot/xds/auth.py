"""Who may ask for a proxy's configuration on the secure port (istiod's XDS_AUTH and identity check).

A stream on the TLS port must prove an identity (a reviewed service-account token, or a verified
client certificate), or it is refused UNAUTHENTICATED. Its first request then names the proxy; one of
the identities must be a SPIFFE ID of the proxy's namespace and, when the proxy says which, its
service account, or the stream is refused PERMISSION_DENIED. The plaintext port is anonymous and
not checked, as istiod's 15010.

Stricter than istiod: a proxy on the secure port that names no namespace is refused, rather than
skipping the namespace check.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from meshpilot.ca.authenticate import Authenticator, Caller
from meshpilot.model.proxy import Proxy

log = logging.getLogger(__name__)

_SPIFFE = re.compile(r"spiffe://(?P<td>[^/]+)/ns/(?P<ns>[^/]+)/sa/(?P<sa>[^/]+)")


class AuthorizationError(Exception):
    """No identity of the stream may ask for this proxy's configuration."""


def is_tls(context: grpc.aio.ServicerContext) -> bool:
    kind: list[bytes] = context.auth_context().get("transport_security_type") or []
    return kind == [b"ssl"]


async def authenticate(
    authenticators: Sequence[Authenticator], context: grpc.aio.ServicerContext
) -> Caller | None:
    """The first authenticator's answer that names the caller; None when none does."""
    auth = context.auth_context()
    metadata = tuple(context.invocation_metadata() or ())
    for authenticator in authenticators:
        try:
            caller = await authenticator.authenticate(auth, metadata)
        except Exception:  # an authenticator that fails (API server down, bad input) proves nothing
            log.exception("%s failed; trying the next", type(authenticator).__name__)
            continue
        if caller is not None:
            return caller
    return None


@dataclass(frozen=True, slots=True)
class SpiffeId:
    trust_domain: str
    namespace: str
    service_account: str

    @classmethod
    def parse(cls, uri: str) -> SpiffeId | None:
        match = _SPIFFE.fullmatch(uri)
        return cls(match["td"], match["ns"], match["sa"]) if match else None


def authorize(proxy: Proxy, identities: Sequence[str]) -> str:
    """The identity that may ask for ``proxy``'s configuration, or AuthorizationError."""
    namespace = proxy.config_namespace
    account = proxy.metadata.service_account
    if not namespace:
        raise AuthorizationError(f"proxy {proxy.id} names no namespace")
    for uri in identities:
        spiffe = SpiffeId.parse(uri)
        if spiffe is None:
            continue
        if spiffe.namespace == namespace and (not account or spiffe.service_account == account):
            return uri
    raise AuthorizationError(f"no identity ({', '.join(identities)}) matches {namespace}/{account or '*'}")
