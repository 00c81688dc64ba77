"""``/validate`` over real HTTPS: a ``meshpilot discovery`` process and a client verifying its certificate.

The process serves a certificate issued by the test CA for istiod's Service
name; the client trusts only that CA, so every request here also proves the
TLS setup. The self-signed mode is checked in-process: the client trusts
exactly the certificate the server generated.
"""

from __future__ import annotations

import contextlib
import datetime
import http.client
import ipaddress
import json
import socket
import ssl
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from support import certs
from support.processes import Meshpilot, free_port

from meshpilot.server.metrics import Metrics
from meshpilot.server.settings import Address
from meshpilot.webhooks.server import MAX_BODY_BYTES, WebhookServer

HOST = "127.0.6.1"
SERVICE_NAME = "istiod.istio-system.svc"


def issue_serving_cert(ca: certs.TestCA, directory: Path) -> tuple[Path, Path]:
    """A serving certificate for istiod's Service name and HOST, signed by the test CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=2))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName(SERVICE_NAME), x509.IPAddress(ipaddress.ip_address(HOST))]
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    cert_file, key_file = directory / "tls.crt", directory / "tls.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_file, key_file


class Client:
    """HTTPS to the webhook port; the server certificate is verified against ``cadata``."""

    def __init__(self, port: int, cadata: str, server_hostname: str = SERVICE_NAME) -> None:
        self.port = port
        self.context = ssl.create_default_context(cadata=cadata)
        self.server_hostname = server_hostname

    def request(
        self, method: str, path: str, body: bytes = b"", content_type: str | None = "application/json"
    ) -> tuple[int, bytes]:
        raw = socket.create_connection((HOST, self.port), timeout=10)
        try:
            tls = self.context.wrap_socket(raw, server_hostname=self.server_hostname)
        except BaseException:
            raw.close()
            raise
        conn = http.client.HTTPConnection(HOST, self.port, timeout=10)
        conn.sock = tls
        try:
            headers = {"Content-Length": str(len(body))}
            if content_type is not None:
                headers["Content-Type"] = content_type
            # A refused large body may break the send; the answer is still there to read.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def review(self, review: dict[str, Any], path: str = "/validate") -> dict[str, Any]:
        status, body = self.request("POST", path, json.dumps(review).encode())
        assert status == 200, body
        answer: dict[str, Any] = json.loads(body)
        return answer


def virtual_service(name: str, weight: int = 100, **http_extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": name, "namespace": "bookinfo"},
        "spec": {
            "hosts": ["reviews"],
            "http": [{"route": [{"destination": {"host": "reviews"}, "weight": weight}], **http_extra}],
        },
    }


def review(
    obj: dict[str, Any] | None, operation: str = "CREATE", api_version: str = "admission.k8s.io/v1"
) -> dict[str, Any]:
    request: dict[str, Any] = {
        "uid": str(uuid.uuid4()),
        "kind": {"group": "networking.istio.io", "version": "v1", "kind": "VirtualService"},
        "resource": {"group": "networking.istio.io", "version": "v1", "resource": "virtualservices"},
        "namespace": "bookinfo",
        "operation": operation,
        "object": obj,
    }
    return {"apiVersion": api_version, "kind": "AdmissionReview", "request": request}


@pytest.fixture(scope="module")
def webhook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Meshpilot, Client]]:
    workdir = tmp_path_factory.mktemp("webhook")
    ca = certs.TestCA()
    cert_file, key_file = issue_serving_cert(ca, workdir / "tls")
    config = workdir / "config"
    config.mkdir()
    port = free_port(HOST)
    extra = ["--webhook-addr", f"{HOST}:{port}", "--tls-cert-file", str(cert_file)]
    extra += ["--tls-key-file", str(key_file)]
    proc = Meshpilot(workdir, config, extra=extra)
    proc.start()
    try:
        proc.wait_ready()
        yield proc, Client(port, ca.root_pem.decode())
    finally:
        proc.stop()


def test_valid_virtual_service_is_allowed_and_uid_echoed(webhook: tuple[Meshpilot, Client]) -> None:
    _, client = webhook
    sent = review(virtual_service("good"))
    answer = client.review(sent)
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == sent["request"]["uid"]
    assert answer["response"]["allowed"] is True
    assert "warnings" not in answer["response"]


def test_invalid_virtual_service_is_denied_with_istiod_wording(webhook: tuple[Meshpilot, Client]) -> None:
    proc, client = webhook
    before = proc.metric(
        'galley_validation_failed{group="networking.istio.io",reason="invalid_resource",'
        'resource="virtualservices",version="v1"}'
    )
    sent = review(virtual_service("bad", weight=-5))
    response = client.review(sent)["response"]
    assert response["allowed"] is False
    assert response["uid"] == sent["request"]["uid"]
    assert (
        response["status"]["message"] == "configuration is invalid: 1 error occurred:\n\t* weight -5 < 0\n\n"
    )
    after = proc.metric(
        'galley_validation_failed{group="networking.istio.io",reason="invalid_resource",'
        'resource="virtualservices",version="v1"}'
    )
    assert after == before + 1


def test_update_is_validated_and_delete_allowed(webhook: tuple[Meshpilot, Client]) -> None:
    _, client = webhook
    bad = virtual_service("bad", weight=-5)
    assert client.review(review(bad, operation="UPDATE"))["response"]["allowed"] is False
    assert client.review(review(bad, operation="DELETE"))["response"]["allowed"] is True


def test_v1beta1_review_is_answered_in_v1beta1(webhook: tuple[Meshpilot, Client]) -> None:
    _, client = webhook
    sent = review(virtual_service("old-api"), api_version="admission.k8s.io/v1beta1")
    answer = client.review(sent, path="/validate/extra")
    assert answer["apiVersion"] == "admission.k8s.io/v1beta1"
    assert answer["response"] == {"uid": sent["request"]["uid"], "allowed": True}


def test_warnings_are_returned(webhook: tuple[Meshpilot, Client]) -> None:
    _, client = webhook
    obj = virtual_service("mirrored", mirror={"host": "shadow"}, mirrorPercent=50)
    response = client.review(review(obj))["response"]
    assert response["allowed"] is True
    assert response["warnings"] == [
        'using deprecated setting "mirrorPercent", use "mirrorPercentage" instead'
    ]


def test_unknown_kind_and_unknown_field_are_denied(webhook: tuple[Meshpilot, Client]) -> None:
    _, client = webhook
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": {}}
    response = client.review(review(deployment))["response"]
    assert response["status"]["message"] == "unrecognized type apps/v1, Kind=Deployment"
    assert response["allowed"] is False
    extra_field = {**virtual_service("x"), "extra": 1}
    response = client.review(review(extra_field))["response"]
    assert response["allowed"] is False
    assert response["status"]["message"] == 'unknown field "extra" on VirtualService resource bookinfo/x'


def test_transport_errors(webhook: tuple[Meshpilot, Client]) -> None:
    proc, client = webhook
    body = json.dumps(review(virtual_service("good"))).encode()
    before = proc.metric('galley_validation_http_error{status="415"}')
    assert client.request("POST", "/validate", body, content_type="text/plain")[0] == 415
    assert client.request("POST", "/validate", body, content_type=None)[0] == 415
    assert proc.metric('galley_validation_http_error{status="415"}') == before + 1 + 1
    status, text = client.request("POST", "/validate", b"")
    assert (status, text) == (400, b"no body found\n")
    status, _ = client.request("POST", "/validate", b"x" * (MAX_BODY_BYTES + 1))
    assert status == 413
    assert proc.running


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[1, 2]",
        b'"text"',
        b"{}",
        b'{"apiVersion": "v1", "kind": "Pod"}',
        b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}',
        b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"operation": 5}}',
        b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", '
        b'"request": {"operation": "CREATE", "object": [1]}}',
        b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", '
        b'"request": {"operation": "CREATE", "object": {"apiVersion": "networking.istio.io/v1", '
        b'"kind": "VirtualService", "metadata": 7, "spec": "x"}}}',
        "\u00ff\u00fe".encode("utf-16"),
    ],
)
def test_garbage_is_denied_not_crashed(webhook: tuple[Meshpilot, Client], body: bytes) -> None:
    proc, client = webhook
    status, raw = client.request("POST", "/validate", body)
    assert status == 200, raw
    answer = json.loads(raw)
    assert answer["response"]["allowed"] is False
    assert answer["response"]["status"]["message"]
    assert proc.running


def test_server_still_ready_afterwards(webhook: tuple[Meshpilot, Client]) -> None:
    proc, client = webhook
    assert client.request("GET", "/ready", content_type=None) == (200, b"")
    assert proc.get("/ready")[0] == 200
    metric = 'galley_validation_passed{group="networking.istio.io",resource="virtualservices",version="v1"}'
    before = proc.metric(metric)
    assert client.review(review(virtual_service("still-ok")))["response"]["allowed"] is True
    assert proc.metric(metric) == before + 1


def test_untrusted_client_cannot_connect(webhook: tuple[Meshpilot, Client]) -> None:
    _, client = webhook
    stranger = Client(client.port, certs.TestCA().root_pem.decode())
    with pytest.raises(ssl.SSLCertVerificationError):
        stranger.request("GET", "/ready", content_type=None)


async def test_self_signed_certificate_names_istiod_and_the_address() -> None:
    metrics = Metrics()
    port = free_port(HOST)
    server = WebhookServer(Address(HOST, port), metrics, lambda: True)
    seen: list[dict[str, Any]] = []

    def echo(request: dict[str, Any]) -> dict[str, Any]:
        seen.append(request)
        if request.get("operation") == "BOOM":
            raise RuntimeError("handler bug")
        return {"allowed": True}

    server.add_review_handler("/inject", echo)
    await server.start()
    try:
        with pytest.raises(RuntimeError):
            server.add_review_handler("/late", echo)
        context = ssl.create_default_context(cadata=server.cert_pem.decode())
        async with aiohttp.ClientSession() as session:
            for hostname in (SERVICE_NAME, "istiod.istio-system.svc.cluster.local", HOST):
                # Connect to HOST but verify the certificate for ``hostname``.
                resolver_free_url = f"https://{HOST}:{port}/ready"
                async with session.get(resolver_free_url, ssl=context, server_hostname=hostname) as response:
                    assert response.status == 200
            url = f"https://{HOST}:{port}/inject/cluster/c1"
            sent = review(virtual_service("any"))
            async with session.post(url, json=sent, ssl=context) as response:
                assert response.status == 200
                answer = await response.json()
            assert answer["response"] == {"uid": sent["request"]["uid"], "allowed": True}
            assert seen[0]["uid"] == sent["request"]["uid"]
            sent["request"]["operation"] = "BOOM"
            async with session.post(url, json=sent, ssl=context) as response:
                answer = await response.json()
            assert answer["response"]["allowed"] is False
            assert "handler bug" in answer["response"]["status"]["message"]
            await check_shared_transport_rules(session, f"https://{HOST}:{port}", context, metrics)
            async with session.get(f"https://{HOST}:{port}/ready", ssl=context) as response:
                assert response.status == 200
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                async with session.get(
                    f"https://{HOST}:{port}/ready", ssl=context, server_hostname="example.com"
                ):
                    pass
    finally:
        await server.stop()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--tls-cert-file", "{dir}/missing.crt", "--tls-key-file", "{dir}/missing.key"], "cannot load"),
        (["--tls-cert-file", "{dir}/missing.crt"], "must be given together"),
    ],
)
def test_bad_certificate_flags_fail_with_a_clear_message(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    config = tmp_path / "config"
    config.mkdir()
    extra = ["--webhook-addr", f"{HOST}:{free_port(HOST)}", *(f.format(dir=tmp_path) for f in flags)]
    proc = Meshpilot(tmp_path, config, extra=extra)
    proc.start()
    try:
        assert proc.proc is not None
        assert proc.proc.wait(20) == 2
    finally:
        proc.stop()
    assert message in proc.log()
    assert "Traceback" not in proc.log()


async def check_shared_transport_rules(
    session: aiohttp.ClientSession, base: str, context: ssl.SSLContext, metrics: Metrics
) -> None:
    """Every review path refuses bad transport alike; only /validate's refusals count as galley's."""

    def http_errors(status: int) -> float:
        return (
            metrics.registry.get_sample_value("galley_validation_http_error_total", {"status": str(status)})
            or 0
        )

    async def oversized() -> AsyncIterator[bytes]:
        # Chunked, so no Content-Length warns the server: it must stop reading by itself.
        chunk = b" " * 65536
        for _ in range(MAX_BODY_BYTES // len(chunk) + 2):
            yield chunk

    for path in ("/inject", "/validate"):
        headers = {"Content-Type": "application/json"}
        async with session.post(base + path, data=oversized(), headers=headers, ssl=context) as response:
            assert response.status == 413
        async with session.get(base + path, ssl=context) as response:
            assert (response.status, await response.text()) == (400, "no body found\n")
        headers = {"Content-Type": "application/json; charset=utf-8"}
        async with session.post(base + path, data=b"{}", headers=headers, ssl=context) as response:
            assert response.status == 415
        if path == "/inject":
            assert http_errors(413) == http_errors(400) == http_errors(415) == 0
    assert http_errors(413) == http_errors(400) == http_errors(415) == 1


async def test_ready_follows_the_discovery_server() -> None:
    ready = False
    port = free_port(HOST)
    server = WebhookServer(Address(HOST, port), Metrics(), lambda: ready)
    await server.start()
    try:
        context = ssl.create_default_context(cadata=server.cert_pem.decode())
        async with aiohttp.ClientSession() as session:
            async with session.get(f"https://{HOST}:{port}/ready", ssl=context) as response:
                assert response.status == 503
            ready = True
            async with session.get(f"https://{HOST}:{port}/ready", ssl=context) as response:
                assert response.status == 200
    finally:
        await server.stop()
