"""Who is calling the CA: istiod's two authenticators, tried in order.

- A client certificate that the TLS handshake verified against the mesh root: its URI SANs are the
  caller's identities (a workload renewing with the certificate it has).
- A Kubernetes service-account token (``authorization: Bearer``), reviewed by the API server for
  the CA's audience (``istio-ca``): ``system:serviceaccount:<ns>:<sa>`` becomes
  ``spiffe://<trust domain>/ns/<ns>/sa/<sa>``.

An authenticator that cannot tell returns None; a caller no authenticator accepts is refused.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cryptography import x509

from meshpilot.model.spiffe import spiffe_identity

log = logging.getLogger(__name__)

#: istiod's default audience for the tokens it accepts (TOKEN_AUDIENCES).
CA_AUDIENCE = "istio-ca"
_SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"


@dataclass(frozen=True, slots=True)
class Caller:
    identities: tuple[str, ...]
    #: How the caller was authenticated, for logs and metrics.
    by: str


class Authenticator(Protocol):
    async def authenticate(
        self, auth: dict[str, list[bytes]], metadata: Sequence[tuple[str, Any]]
    ) -> Caller | None:
        """The caller, from the TLS auth context and the request metadata; None if this cannot tell."""
        ...


class ClientCertificate:
    """The URI SANs of the verified client certificate."""

    async def authenticate(
        self, auth: dict[str, list[bytes]], metadata: Sequence[tuple[str, Any]]
    ) -> Caller | None:
        pem = (auth.get("x509_pem_cert") or [b""])[0]
        if not pem:
            return None
        try:
            san = x509.load_pem_x509_certificate(pem).extensions.get_extension_for_class(
                x509.SubjectAlternativeName
            )
        except (ValueError, x509.ExtensionNotFound):
            # A mesh certificate without names proves no identity; not an error worth a traceback.
            return None
        uris = tuple(san.value.get_values_for_type(x509.UniformResourceIdentifier))
        return Caller(uris, "client certificate") if uris else None


@dataclass(frozen=True, slots=True)
class TokenReview:
    """What the API server said of a token: only an authenticated review has a user."""

    authenticated: bool
    username: str = ""
    groups: tuple[str, ...] = ()
    audiences: tuple[str, ...] = ()


#: Reviews a token for an audience.
TokenReviewer = Callable[[str, str], TokenReview]
_SERVICE_ACCOUNTS_GROUP = "system:serviceaccounts"
#: A namespace or service account name: a DNS label or subdomain, as Kubernetes validates them.
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


class KubernetesToken:
    """A service-account token, reviewed by the API server (TokenReview) for the CA's audience."""

    def __init__(
        self, review: TokenReviewer, trust_domain: Callable[[], str], audience: str = CA_AUDIENCE
    ) -> None:
        self._review = review
        #: Read per call: MeshConfig (and its trustDomain) may arrive from the API server after start.
        self._trust_domain = trust_domain
        self._audience = audience

    async def authenticate(
        self, auth: dict[str, list[bytes]], metadata: Sequence[tuple[str, Any]]
    ) -> Caller | None:
        token = _bearer(metadata)
        if token is None:
            return None
        # The review is a blocking HTTP call to the API server: off the event loop.
        review = await asyncio.to_thread(self._review, token, self._audience)
        if not review.authenticated or self._audience not in review.audiences:
            log.info("token refused by the API server for audience %s", self._audience)
            return None
        # As istiod: a service account's token, by its group and a name of exactly four parts.
        parts = review.username.split(":")
        if _SERVICE_ACCOUNTS_GROUP not in review.groups or len(parts) != 4 or review.username.count(":") != 3:
            log.info("token of %r is not a service account's", review.username)
            return None
        _, _, namespace, account = parts
        if f"{parts[0]}:{parts[1]}:" != _SERVICE_ACCOUNT_PREFIX or not (
            _NAME.fullmatch(namespace) and _NAME.fullmatch(account)
        ):
            log.info("token of %r is not a service account's", review.username)
            return None
        return Caller((spiffe_identity(self._trust_domain(), namespace, account),), "kubernetes token")


async def authenticate(
    authenticators: Sequence[Authenticator], auth: dict[str, list[bytes]], metadata: Sequence[tuple[str, Any]]
) -> Caller | None:
    """The first authenticator's answer that names the caller, in order; None when none does. An
    authenticator that fails (API server down, bad input) proves nothing: the next one is asked."""
    for authenticator in authenticators:
        try:
            caller = await authenticator.authenticate(auth, metadata)
        except Exception:
            log.exception("%s failed; trying the next", type(authenticator).__name__)
            continue
        if caller is not None:
            return caller
    return None


def _bearer(metadata: Sequence[tuple[str, Any]]) -> str | None:
    for key, value in metadata:
        if key.lower() == "authorization" and isinstance(value, str):
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def kubernetes_token_reviewer(api_client: Any) -> TokenReviewer:
    """A TokenReviewer on the official client's AuthenticationV1Api."""
    from kubernetes.client import AuthenticationV1Api, V1TokenReview, V1TokenReviewSpec

    api = AuthenticationV1Api(api_client)

    def review(token: str, audience: str) -> TokenReview:
        body = V1TokenReview(spec=V1TokenReviewSpec(token=token, audiences=[audience]))
        # Bounded: a hung API server must not hold the CA's worker threads.
        status = api.create_token_review(body, _request_timeout=(5, 10)).status
        if status is None or not status.authenticated or status.user is None:
            return TokenReview(False)
        user = status.user
        return TokenReview(True, user.username or "", tuple(user.groups or ()), tuple(status.audiences or ()))

    return review
