"""Who may read debug information over xDS, and about which proxies (istiod's debug authorization).

A stream's identity is what the secure port verified (``Connection.identity``); plaintext streams
have none. With ``enabled`` (ENABLE_DEBUG_ENDPOINT_AUTH, on by default) a stream without one gets
no sync status or config dump, and an identity outside the system namespace (and outside
``allowed_namespaces``) sees only the proxies of its own namespace. The debug pages by name
(``istio.io/debug``) always need an identity; outside the system namespace only the per-proxy pages
are open. Turning ``enabled`` off opens sync status and config dumps on the plaintext port, as
istiod does for ``istioctl --plaintext``.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from meshpilot.model.spiffe import SpiffeId

#: The pages a caller outside the system namespace may read, about its own namespace's proxies.
NAMESPACE_PAGES = frozenset({"config_dump", "ndsz", "edsz"})


class DebugRefused(Exception):
    """The request may not be answered; the stream ends with ``code``."""

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
        namespace = _namespace(identity)
        if namespace is None:
            raise DebugRefused(grpc.StatusCode.UNAUTHENTICATED, "authentication required")
        return self._scope(namespace, system_namespace)

    def page_scope(self, identity: str, page: str, system_namespace: str) -> str:
        """The namespace a debug page request is limited to ("" for all), or DebugRefused."""
        namespace = _namespace(identity)
        if namespace is None:
            raise DebugRefused(grpc.StatusCode.UNAUTHENTICATED, "authentication required")
        if namespace != system_namespace and page not in NAMESPACE_PAGES:
            raise DebugRefused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"the debug info is not available for current identity: {identity!r}",
            )
        return self._scope(namespace, system_namespace) if self.enabled else ""

    def _scope(self, namespace: str, system_namespace: str) -> str:
        if namespace == system_namespace or namespace in self.allowed_namespaces:
            return ""
        return namespace


def _namespace(identity: str) -> str | None:
    spiffe = SpiffeId.parse(identity) if identity else None
    return spiffe.namespace if spiffe is not None else None
