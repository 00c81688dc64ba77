"""RS256 JSON Web Tokens for RequestAuthentication tests, made by hand from an RSA key made here."""

from __future__ import annotations

import base64
import json
import time

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

#: The issuer the tests' RequestAuthentication rules name.
ISSUER = "https://issuer.meshpilot.test"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _uint(n: int) -> str:
    return b64url(n.to_bytes((n.bit_length() + 7) // 8, "big"))


class Signer:
    """An RSA key, its JWKS and RS256 tokens signed with it."""

    def __init__(self, kid: str) -> None:
        self.kid = kid
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    @property
    def modulus(self) -> str:
        return _uint(self.key.public_key().public_numbers().n)

    def jwks(self) -> str:
        public = self.key.public_key().public_numbers()
        jwk = {
            "kty": "RSA",
            "alg": "RS256",
            "use": "sig",
            "kid": self.kid,
            "n": _uint(public.n),
            "e": _uint(public.e),
        }
        return json.dumps({"keys": [jwk]})

    def token(self, *, issuer: str = ISSUER, subject: str = "alice", ttl: int = 3600) -> str:
        header = {"alg": "RS256", "typ": "JWT", "kid": self.kid}
        now = int(time.time())
        payload = {"iss": issuer, "sub": subject, "iat": now, "exp": now + ttl}
        signing_input = f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(payload).encode())}"
        signature = self.key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing_input}.{b64url(signature)}"
