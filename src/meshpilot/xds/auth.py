"""Who may ask for a proxy's configuration on the secure port (istiod's XDS_AUTH and identity check).

A stream on the TLS port must prove an identity (a reviewed service-account token, or a verified
client certificate), or it is refused UNAUTHENTICATED. Its first request then names the proxy; one of
the identities must be a SPIFFE ID of the proxy's namespace and, when the proxy says which, its
service account, or the stream is refused PERMISSION_DENIED. The plaintext port is anonymous and
not checked, as istiod's 15010.

Which port a stream came in on is decided by the server it was accepted by (the secure server's handler
is built with ``secure=True``), never read back from the connection.

Stricter than istiod: a proxy on the secure port that names no namespace is refused, rather than
skipping the namespace check, and an identity of another trust domain counts for nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence

from meshpilot.model.proxy import Proxy
from meshpilot.model.spiffe import SpiffeId

log = logging.getLogger(__name__)


class AuthorizationError(Exception):
    """No identity of the stream may ask for this proxy's configuration."""


def authorize(proxy: Proxy, identities: Sequence[str], trust_domains: Collection[str]) -> str:
    """The identity that may ask for ``proxy``'s configuration, or AuthorizationError. Only identities
    of the mesh's trust domains count: a certificate of another mesh under a shared root proves nothing."""
    namespace = proxy.config_namespace
    account = proxy.metadata.service_account
    if not namespace:
        raise AuthorizationError(f"proxy {proxy.id} names no namespace")
    for uri in identities:
        spiffe = SpiffeId.parse(uri)
        if spiffe is None or spiffe.trust_domain not in trust_domains:
            continue
        if spiffe.namespace == namespace and (not account or spiffe.service_account == account):
            return uri
    raise AuthorizationError(f"no identity ({', '.join(identities)}) matches {namespace}/{account or '*'}")
