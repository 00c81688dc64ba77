"""Who may read debug information, and about which proxies: one rule for xDS and for HTTP.

The caller's identity is what was verified: for an xDS stream the identity the secure port proved
(``Connection.identity``; plaintext streams have none), for an HTTP ``/debug`` request the identity
its bearer token was reviewed into (``server.debug_access``, which lets loopback callers through
before asking this rule). The system namespace is the mesh root namespace, as istiod takes it.

- A debug page by name (``istio.io/debug``, ``/debug/<page>`` over HTTP) always needs an identity.
  The sync status and config dump types (``istio.io/debug/syncz``, ``istio.io/debug/config_dump``)
  need one only while ``enabled``: turning it off opens them on the plaintext port, as istiod does
  for ``istioctl --plaintext``.
- With ``enabled`` (ENABLE_DEBUG_ENDPOINT_AUTH, the default), an identity of the system namespace or
  of ``allowed_namespaces`` (DEBUG_ENDPOINT_AUTH_ALLOWED_NAMESPACES) reads everything. Any other
  identity reads only the per-proxy pages (``NAMESPACE_PAGES``), and only about proxies of its own
  namespace: the answer is a *scope*, the namespace the page must limit itself to
  (``introspect.find_connection`` and ``sorted_connections`` take it). An identity that names no
  namespace is refused.
- With ``enabled`` off, every page is open, unscoped, to any authenticated caller.

istiod writes this rule three times and they differ at the edges: its xDS debug pages ignore
``allowed_namespaces`` and keep the page limit with the flag off, and its HTTP config dump limits
an allowed namespace to its own proxies. Here the flag and the list mean the same on every path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from meshpilot.model.spiffe import SpiffeId

#: The pages a caller outside the system namespace may read, about its own namespace's proxies
#: (istiod's list; meshpilot serves no ``ndsz`` or ``edsz``, so for it that is ``config_dump``).
NAMESPACE_PAGES = frozenset({"config_dump", "ndsz", "edsz"})


class DebugRefused(Exception):
    """The request may not be answered: over xDS the stream ends with ``code``; over HTTP
    UNAUTHENTICATED is a 401 and anything else a 403."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class DebugAccess:
    #: ENABLE_DEBUG_ENDPOINT_AUTH.
    enabled: bool = True
    #: DEBUG_ENDPOINT_AUTH_ALLOWED_NAMESPACES: namespaces treated like the system namespace.
    allowed_namespaces: frozenset[str] = frozenset()

    def status_scope(self, identity: str, system_namespace: str) -> str:
        """The namespace a sync status or config dump request is limited to ("" for all), or
        DebugRefused when it may not be answered at all."""
        if not self.enabled:
            return ""
        return self._scope(identity, system_namespace)

    def page_scope(self, identity: str, page: str, system_namespace: str) -> str:
        """The namespace a request for debug page ``page`` (``syncz``, ``config_dump``, ...) is
        limited to ("" for all), or DebugRefused."""
        if not identity:
            raise DebugRefused(grpc.StatusCode.UNAUTHENTICATED, "authentication required")
        if not self.enabled:
            return ""
        scope = self._scope(identity, system_namespace)
        if scope and page not in NAMESPACE_PAGES:
            raise DebugRefused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"the debug info is not available for current identity: {identity!r}",
            )
        return scope

    def _scope(self, identity: str, system_namespace: str) -> str:
        spiffe = SpiffeId.parse(identity) if identity else None
        if spiffe is None:
            if not identity:
                raise DebugRefused(grpc.StatusCode.UNAUTHENTICATED, "authentication required")
            raise DebugRefused(grpc.StatusCode.PERMISSION_DENIED, f"no namespace in identity {identity!r}")
        namespace = spiffe.namespace
        if namespace == system_namespace or namespace in self.allowed_namespaces:
            return ""
        return namespace


def judged_identity(identities: Sequence[str]) -> str:
    """Of a caller's identities, the one this rule judges: the first SPIFFE identity (istiod takes
    the namespace of the first that parses), else the first, else "" (none)."""
    return next((i for i in identities if SpiffeId.parse(i) is not None), identities[0] if identities else "")
