"""SDS on ADS: the Secrets named by ``credentialName``, to the proxies allowed to have them.

istiod's SecretGen (``pilot/pkg/xds/sds.go``), rule by rule:

* only a stream with a verified identity (the secure port) is served; a
  plaintext stream gets nothing and is logged;
* a name is ``kubernetes://[<ns>/]<name>[-cacert]``; another scheme is
  counted and skipped;
* only Secrets of the identity's own namespace; the certificate and key
  only if the identity's service account may list secrets there (a
  SubjectAccessReview, see ``kube/secret_access.py``), the CA alone
  (``-cacert``) without that;
* a denied or failed resource is left out of the response, logged and
  counted (``pilot_sds_certificate_errors_total``), as is a Secret without
  the keys istiod reads; a certificate that does not parse or is out of its
  validity is counted and still served;
* a Secret change pushes (``Kind.SECRET`` in the request).
"""

from __future__ import annotations

import datetime
import functools
import logging
from collections.abc import Callable

from cryptography import x509
from envoy.config.core.v3 import base_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, secret_pb2

from meshpilot.model.credentials import (
    CredentialError,
    CredentialReader,
    SecretAccess,
    SecretResource,
    cert_info,
    parse_resource_name,
)
from meshpilot.model.kind import Kind
from meshpilot.model.push_request import PushRequest
from meshpilot.model.spiffe import SpiffeId
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.generators.base import GenerationContext, Resource, ResourceList
from meshpilot.xds.types import TypeUrl

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1024)
def _validity(pem: bytes) -> tuple[datetime.datetime, datetime.datetime] | str:
    """The window in which every certificate of a PEM chain is valid, or why it does not parse."""
    try:
        certs = x509.load_pem_x509_certificates(pem)
    except ValueError as err:
        return f"pem decode failed: {err}"
    return max(c.not_valid_before_utc for c in certs), min(c.not_valid_after_utc for c in certs)


def certificate_problem(pem: bytes) -> str:
    """Why a PEM chain is not a valid certificate now ("" if it is), as istiod's ValidateCertificate.
    The parse is cached; the clock is read at each call, so an expiry is seen when it comes."""
    window = _validity(pem)
    if isinstance(window, str):
        return window
    now = datetime.datetime.now(datetime.UTC)
    if not window[0] <= now <= window[1]:
        return "certificate is expired or not yet valid"
    return ""


def tls_secret(name: str, cert: bytes, key: bytes, staple: bytes = b"") -> secret_pb2.Secret:
    certificate = common_pb2.TlsCertificate(
        certificate_chain=base_pb2.DataSource(inline_bytes=cert),
        private_key=base_pb2.DataSource(inline_bytes=key),
    )
    if staple:
        certificate.ocsp_staple.inline_bytes = staple
    return secret_pb2.Secret(name=name, tls_certificate=certificate)


def ca_secret(name: str, cert: bytes, crl: bytes = b"") -> secret_pb2.Secret:
    context = common_pb2.CertificateValidationContext(trusted_ca=base_pb2.DataSource(inline_bytes=cert))
    if crl:
        context.crl.inline_bytes = crl
    return secret_pb2.Secret(name=name, validation_context=context)


class SecretGenerator:
    """Generates ``Secret`` resources from ``reader``, authorized by ``access``."""

    type_url = TypeUrl.SECRET

    def __init__(
        self, reader: CredentialReader, access: SecretAccess, count_error: Callable[[], None]
    ) -> None:
        self._reader = reader
        self._access = access
        self._count_error = count_error

    def needs_push(self, request: PushRequest) -> bool:
        """istiod's sdsNeedsPush: forced pushes and Secret changes only."""
        return request.forced or Kind.SECRET in request.updated_kinds

    def generate(
        self, ctx: GenerationContext, watch: WatchedResource, names: frozenset[str] | None
    ) -> list[Resource] | None:
        identity = SpiffeId.parse(ctx.identity) if ctx.identity else None
        if identity is None:
            log.warning(
                "proxy %s is not authorized to receive credentials: connect over the secure port "
                "with a verified identity",
                ctx.proxy.id,
            )
            return None
        wanted = names if names is not None else watch.names
        out = ResourceList()
        for resource in self._authorized(ctx, identity, sorted(wanted)):
            built = self._build(resource)
            if built is not None:
                out.append(Resource.of(resource.resource_name, built))
        return out

    def _authorized(
        self, ctx: GenerationContext, identity: SpiffeId, names: list[str]
    ) -> list[SecretResource]:
        allowed, denied = [], []
        reason: str | None = ""
        asked = False
        for name in names:
            try:
                resource = parse_resource_name(name, identity.namespace)
            except CredentialError as err:
                self._count_error()
                log.warning("proxy %s: %s", ctx.proxy.id, err)
                continue
            if resource.namespace != identity.namespace:
                denied.append(resource.name)
                continue
            if resource.ca_only:
                allowed.append(resource)
                continue
            if not asked:
                reason, asked = self._access.check(identity.service_account, identity.namespace), True
            if reason == "":
                allowed.append(resource)
            elif reason is None:
                log.info(
                    "proxy %s: access of %s/%s to secrets not reviewed yet; %s waits for it",
                    ctx.proxy.id,
                    identity.namespace,
                    identity.service_account,
                    name,
                )
            else:
                denied.append(resource.name)
        if denied:
            self._count_error()
            why = reason or "cross namespace secret reference is not allowed"
            log.warning(
                "proxy %s attempted to access unauthorized certificates %s: %s",
                ctx.proxy.id,
                ", ".join(denied[:3]) + (f" and {len(denied) - 3} more" if len(denied) > 3 else ""),
                why,
            )
        return allowed

    def _build(self, resource: SecretResource) -> secret_pb2.Secret | None:
        try:
            info = cert_info(self._reader, resource)
        except CredentialError as err:
            self._count_error()
            what = "ca certificate" if resource.ca_only else "key and certificate"
            log.warning("failed to fetch %s for %s: %s", what, resource.resource_name, err)
            return None
        problem = certificate_problem(info.cert)
        if problem:
            self._count_error()
            log.warning(
                "invalid certificates: %s/%s %r: %s",
                resource.namespace,
                resource.name,
                resource.resource_name,
                problem,
            )
        if resource.ca_only:
            return ca_secret(resource.resource_name, info.cert, info.crl)
        return tls_secret(resource.resource_name, info.cert, info.key, info.staple)
