"""The agent's client of the mesh CA: ``IstioCertificateService/CreateCertificate`` over TLS.

As pilot-agent does, the agent proves who it is with its service-account token
(``authorization: Bearer``, re-read on every call because the kubelet rotates
the file) and names its cluster (``clusterid``); it trusts the CA's serving
certificate only if it chains to the mesh root it was given, checked against
``server_name`` when the address is an IP (pilot-agent's ``ISTIOD_SAN``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from meshpilot._proto.istio.security.v1alpha1 import ca_pb2

log = logging.getLogger(__name__)

#: pilot-agent's default CLUSTER_ID.
DEFAULT_CLUSTER_ID = "Kubernetes"
CREATE_CERTIFICATE = "/istio.v1.auth.IstioCertificateService/CreateCertificate"
#: How long one CreateCertificate may take before it counts as a failure.
DEFAULT_CALL_TIMEOUT = 10.0

ChannelOptions = Sequence[tuple[str, str | int]]


class CaError(Exception):
    """CreateCertificate failed: the gRPC status the CA (or the TLS handshake) ended with."""

    def __init__(self, code: grpc.StatusCode, message: str, address: str = "") -> None:
        where = f"CA at {address}" if address else "CA"
        super().__init__(f"{where}: {code.name}: {message}")
        self.code = code
        self.message = message


def open_channel(
    address: str,
    *,
    root_pem: bytes | None,
    server_name: str | None = None,
    options: ChannelOptions = (),
) -> grpc.aio.Channel:
    """A channel to istiod: TLS verified against ``root_pem`` (None: plaintext, for
    controlPlaneAuthPolicy NONE), the name checked overridden by ``server_name``."""
    opts: list[tuple[str, str | int]] = list(options)
    if root_pem is None:
        return grpc.aio.insecure_channel(address, options=opts)
    if server_name:
        opts.append(("grpc.ssl_target_name_override", server_name))
    return grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(root_pem), options=opts)


def call_metadata(token: Callable[[], str | None], cluster_id: str) -> list[tuple[str, str]]:
    """What pilot-agent sends istiod on every call: its cluster and, when it has one, its token."""
    metadata = [("clusterid", cluster_id)]
    value = token()
    if value:
        metadata.append(("authorization", f"Bearer {value}"))
    return metadata


class CaClient:
    """Signs CSRs with the mesh CA; one channel, opened on first use."""

    def __init__(
        self,
        address: str,
        *,
        root_pem: bytes,
        token: Callable[[], str | None],
        server_name: str | None = None,
        cluster_id: str = DEFAULT_CLUSTER_ID,
        timeout: float = DEFAULT_CALL_TIMEOUT,
    ) -> None:
        self.address = address
        self._root_pem = root_pem
        self._token = token
        self._server_name = server_name
        self._cluster_id = cluster_id
        self._timeout = timeout
        self._channel: grpc.aio.Channel | None = None

    async def sign(self, csr_pem: bytes, ttl_seconds: int) -> list[str]:
        """The certificate chain for ``csr_pem``, leaf first and the root last; CaError if refused."""
        if self._channel is None:
            # Opened here, not in __init__: an aio channel belongs to the loop it is made in.
            self._channel = open_channel(self.address, root_pem=self._root_pem, server_name=self._server_name)
        create = self._channel.unary_unary(
            CREATE_CERTIFICATE,
            request_serializer=ca_pb2.IstioCertificateRequest.SerializeToString,
            response_deserializer=ca_pb2.IstioCertificateResponse.FromString,
        )
        request = ca_pb2.IstioCertificateRequest(csr=csr_pem.decode(), validity_duration=ttl_seconds)
        try:
            response: ca_pb2.IstioCertificateResponse = await create(
                request, metadata=call_metadata(self._token, self._cluster_id), timeout=self._timeout
            )
        except grpc.aio.AioRpcError as err:
            raise CaError(err.code(), err.details() or "", self.address) from None
        chain = list(response.cert_chain)
        if not chain:
            raise CaError(
                grpc.StatusCode.INTERNAL, "the CA answered with an empty certificate chain", self.address
            )
        return chain

    async def close(self) -> None:
        if self._channel is not None:
            channel, self._channel = self._channel, None
            await channel.close()


def new_key_and_csr(identity_hint: str | None, algorithm: str = "rsa") -> tuple[bytes, bytes]:
    """A private key (PKCS#8 PEM) and a CSR for it, as pilot-agent makes before each signing.

    ``rsa`` is 2048 bits (pilot-agent's default), ``ecdsa`` P-256 (``ECC_SIGNATURE_ALGORITHM=ECDSA``).
    The CA certifies the caller's authenticated identity whatever the CSR says; ``identity_hint``
    (a SPIFFE URI) is put in the SAN only so the request reads as pilot-agent's does.
    """
    key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
    if algorithm == "rsa":
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    elif algorithm == "ecdsa":
        key = ec.generate_private_key(ec.SECP256R1())
    else:
        raise ValueError(f"unknown key algorithm {algorithm!r}: rsa or ecdsa")
    builder = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([]))
    if identity_hint:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(identity_hint)]), critical=True
        )
    csr = builder.sign(key, hashes.SHA256())
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return key_pem, csr.public_bytes(serialization.Encoding.PEM)


def key_algorithm(ecc_signature_algorithm: str) -> str:
    """The key algorithm for pilot-agent's ``ECC_SIGNATURE_ALGORITHM`` (``ECDSA``, else RSA)."""
    return "ecdsa" if ecc_signature_algorithm.strip().upper() == "ECDSA" else "rsa"
