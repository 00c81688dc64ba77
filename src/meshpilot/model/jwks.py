"""Where generators find the JWKS that RequestAuthentication ``jwksUri``s point to."""

from __future__ import annotations

from typing import Protocol

from meshpilot.model.config import ConfigKey


class JwksLookup(Protocol):
    """Keys fetched for a ``jwksUri`` (or an issuer's discovery document), if any are known.

    A lookup of an unknown source also asks for it to be fetched; ``owner`` is the
    RequestAuthentication that needs it, pushed again when the keys arrive or change.
    """

    def jwks(self, uri: str, issuer: str, timeout_s: float, owner: ConfigKey) -> str | None: ...


class NoJwks:
    """A lookup that knows no keys (every remote JWKS fails closed)."""

    def jwks(self, uri: str, issuer: str, timeout_s: float, owner: ConfigKey) -> str | None:
        return None
