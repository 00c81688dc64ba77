"""The JWKS location and inline JWKS of a RequestAuthentication JWT rule.

istiod parses jwksUri with Go's net/url and inline keys with the jwx library;
their exact error texts are library details. The accept/reject decisions that
matter are reproduced here, and the texts follow Go's where practical.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import string
from typing import Any

from meshpilot.config.validation import goparse
from meshpilot.config.validation.formatting import go_quote

_SCHEME_CHARS = frozenset(string.ascii_letters + string.digits + "+-.")
# Characters Go's net/url leaves alone in a host name.
_HOST_CHARS = frozenset(string.ascii_letters + string.digits + "-._~!$&'()*+,;=:[]<>\"%")
_HEX = frozenset(string.hexdigits)


def _split_scheme(url: str) -> tuple[str, str]:
    for i, ch in enumerate(url):
        if ch.isascii() and ch.isalpha():
            continue
        if ch in _SCHEME_CHARS:
            if i == 0:
                return "", url
            continue
        if ch == ":":
            if i == 0:
                raise ValueError("missing protocol scheme")
            return url[:i], url[i + 1 :]
        return "", url
    return "", url


def _check_escapes(text: str) -> None:
    i = text.find("%")
    while i >= 0:
        code = text[i + 1 : i + 3]
        if len(code) < 2 or not set(code) <= _HEX:
            raise ValueError(f"invalid URL escape {go_quote(text[i : i + 3])}")
        i = text.find("%", i + 3)


def _valid_optional_port(port: str) -> bool:
    return port == "" or (port.startswith(":") and all("0" <= c <= "9" for c in port[1:]))


def _parse_url(url: str) -> tuple[str, str]:
    """Go's url.Parse, far enough to return (lower-cased scheme, port)."""
    url = url.split("#", 1)[0]
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise ValueError("net/url: invalid control character in URL")
    scheme, rest = _split_scheme(url)
    scheme = scheme.lower()
    rest = rest.split("?", 1)[0]
    if not rest.startswith("/"):
        if scheme:
            return scheme, ""  # an opaque URL such as "mailto:x"
        # Avoid reading a malformed scheme ("cache_object:foo") as a path.
        if ":" in rest.split("/", 1)[0]:
            raise ValueError("first path segment in URL cannot contain colon")
    port = ""
    if rest.startswith("//") and (scheme or not rest.startswith("///")):
        authority, slash, path = rest[2:].partition("/")
        rest = slash + path
        host = authority.rpartition("@")[2]
        if host.startswith("["):
            close_at = host.rfind("]")
            if close_at < 0:
                raise ValueError("missing ']' in host")
            colon_port = host[close_at + 1 :]
        else:
            colon = host.rfind(":")
            colon_port = host[colon:] if colon >= 0 else ""
        if not _valid_optional_port(colon_port):
            raise ValueError(f"invalid port {go_quote(colon_port)} after host")
        port = colon_port[1:]
        _check_escapes(host)
        for ch in host:
            if ord(ch) < 0x80 and ch not in _HOST_CHARS:
                raise ValueError(f"invalid character {go_quote(ch)} in host name")
    _check_escapes(rest)
    return scheme, port


def jwks_uri_error(uri: str) -> str | None:
    """An http or https URL, with a numeric port if it has one."""
    try:
        scheme, port = _parse_url(uri)
    except ValueError as err:
        return f"parse {go_quote(uri.split('#', 1)[0])}: {err}"
    if scheme not in ("http", "https"):
        return f"URI scheme {go_quote(scheme)} is not supported"
    if port:
        try:
            goparse.atoi(port)
        except goparse.GoParseError as err:
            return str(err)
    return None


# Python's decoder skips characters outside the alphabet, so they are checked first.
_BASE64URL = re.compile(r"[A-Za-z0-9_-]*={0,2}")


def _is_base64url(value: str) -> bool:
    if _BASE64URL.fullmatch(value) is None:
        return False
    try:
        base64.urlsafe_b64decode(value.rstrip("=") + "=" * (-len(value.rstrip("=")) % 4))
    except (binascii.Error, ValueError):
        return False
    return True


# The members each key type needs, base64url-encoded.
_KEY_MEMBERS = {"RSA": ("n", "e"), "EC": ("crv", "x", "y"), "OKP": ("crv", "x"), "oct": ("k",)}
_NOT_ENCODED = frozenset({"crv"})


def _key_error(key: Any) -> str | None:
    if not isinstance(key, dict):
        return "invalid JWK: not a JSON object"
    kty = key.get("kty")
    if not isinstance(kty, str) or kty not in _KEY_MEMBERS:
        return f"invalid key type from JSON ({kty if isinstance(kty, str) else ''})"
    for member in _KEY_MEMBERS[kty]:
        value = key.get(member)
        if not isinstance(value, str) or not value:
            return f"required field {member} is missing"
        if member in _NOT_ENCODED:
            continue
        if not _is_base64url(value):
            return f"failed to decode field {member}: illegal base64 data"
    return None


def jwks_error(jwks: str) -> str | None:
    """An inline JWK Set (or a single JWK), with each key of a known type and complete."""
    try:
        document = json.loads(jwks)
    except ValueError as err:
        return f"jwks parse error: failed to unmarshal JWK set: {err}"
    if not isinstance(document, dict):
        return "jwks parse error: failed to unmarshal JWK set: not a JSON object"
    if "keys" not in document:
        problem = _key_error(document)
        return f"jwks parse error: failed to parse single key as JWK: {problem}" if problem else None
    keys = document["keys"]
    if not isinstance(keys, list):
        return "jwks parse error: failed to unmarshal JWK set: keys must be a list"
    for key in keys:
        problem = _key_error(key)
        if problem:
            return f"jwks parse error: failed to parse key: {problem}"
    return None
