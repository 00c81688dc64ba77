"""``istio.v1.auth.IstioCertificateService/CreateCertificate``: istiod's checks before signing, in order.

Authenticate (UNAUTHENTICATED: "request authenticate failure"), refuse a CSR that asks for an identity
the caller does not have (PERMISSION_DENIED; istiod's built-in CA ignores the CSR's names), then sign
for the authenticated identities (a bad CSR or TTL is INVALID_ARGUMENT, a CA that cannot sign
INTERNAL). Each outcome is counted under istiod's ``citadel_server_*`` names.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import grpc
from prometheus_client import CollectorRegistry, Counter

from meshpilot._proto.istio.security.v1alpha1 import ca_pb2, ca_pb2_grpc
from meshpilot.ca.authenticate import Authenticator, Caller, authenticate
from meshpilot.ca.authority import (
    CertificateAuthority,
    CsrError,
    SigningError,
    TtlError,
    csr_identities,
    requested_ttl,
)
from meshpilot.server.aborts import clear_abort_frames

log = logging.getLogger(__name__)


class CaMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.csrs = Counter("citadel_server_csr_count", "The number of CSRs received.", registry=registry)
        self.auth_failures = Counter(
            "citadel_server_authentication_failure_count",
            "The number of authentication failures.",
            registry=registry,
        )
        self.sign_errors = Counter(
            "citadel_server_csr_sign_err_count",
            "The number of errors occurred when signing the CSR.",
            ["error_type"],
            registry=registry,
        )
        self.issued = Counter(
            "citadel_server_success_cert_issuance_count",
            "The number of certificates issuances that have succeeded.",
            registry=registry,
        )


class CertificateService(ca_pb2_grpc.IstioCertificateServiceServicer):
    def __init__(
        self, authority: CertificateAuthority, authenticators: Sequence[Authenticator], metrics: CaMetrics
    ) -> None:
        self._authority = authority
        self._authenticators = tuple(authenticators)
        self._metrics = metrics

    async def _caller(self, context: grpc.aio.ServicerContext) -> Caller | None:
        return await authenticate(
            self._authenticators, context.auth_context(), tuple(context.invocation_metadata() or ())
        )

    async def CreateCertificate(
        self,
        request: ca_pb2.IstioCertificateRequest,
        context: grpc.aio.ServicerContext,
    ) -> ca_pb2.IstioCertificateResponse:
        try:
            return await self._create(request, context)
        except grpc.aio.AbortError as err:
            # grpc keeps the abort until a full collection (server.aborts), and with it the frames
            # of its traceback, this one included: not with the request, a CSR of up to the message
            # size limit.
            clear_abort_frames(err)
            del request
            raise

    async def _create(
        self,
        request: ca_pb2.IstioCertificateRequest,
        context: grpc.aio.ServicerContext,
    ) -> ca_pb2.IstioCertificateResponse:
        self._metrics.csrs.inc()
        caller = await self._caller(context)
        if caller is None:
            self._metrics.auth_failures.inc()
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "request authenticate failure")
        assert caller is not None
        try:
            # The certificate names only the caller's identities anyway; a CSR that asks for another
            # is refused outright (as istiod's RA mode does), so the mistake or attempt is seen.
            foreign = [uri for uri in csr_identities(request.csr.encode()) if uri not in caller.identities]
            if foreign:
                self._metrics.sign_errors.labels("IDENTITY_ERROR").inc()
                log.warning(
                    "refused a CSR of %s asking for %s", ", ".join(caller.identities), ", ".join(foreign)
                )
                await context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"the CSR asks for identities the caller does not have: {', '.join(foreign)}",
                )
            ttl = requested_ttl(request.validity_duration)
            # Off the event loop: an RSA signature is a third of a millisecond the pushes need.
            chain = await asyncio.to_thread(
                self._authority.sign, request.csr.encode(), list(caller.identities), ttl
            )
        except CsrError as err:
            self._metrics.sign_errors.labels("CSR_ERROR").inc()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"CSR error: {err}")
        except TtlError as err:
            self._metrics.sign_errors.labels("TTL_ERROR").inc()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except SigningError as err:
            self._metrics.sign_errors.labels("CERT_GEN_ERROR").inc()
            log.error("cannot sign for %s: %s", caller.identities, err)
            await context.abort(grpc.StatusCode.INTERNAL, "failed to sign the certificate")
        self._metrics.issued.inc()
        log.info("issued a certificate for %s (%s)", ", ".join(caller.identities), caller.by)
        return ca_pb2.IstioCertificateResponse(cert_chain=chain)
