"""The webhook server under 10,000 random and malformed AdmissionReviews, over HTTPS, in-process.

Each answer is an AdmissionReview (allowed, or denied with a reason) or a 4xx; never a 500, an
"internal error" denial or a dropped connection. The reviews carry what a hostile caller would:
deeply nested annotations (``proxy.istio.io/config``, ``userVolume``, ``overrides``), a
1,000,000-digit ``proxyCPU``, YAML aliases, values of the wrong JSON type anywhere in the pod or the
envelope, made-up resources (which must not become metric series), junk bodies. Logs stay small:
no traceback, and a bounded number of bytes per review.
"""

from __future__ import annotations

import asyncio
import copy
import io
import json
import random
import re
import ssl
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from support.log_volume import log_volume, series
from support.processes import free_port

from meshpilot.server.metrics import Metrics
from meshpilot.server.settings import Address
from meshpilot.webhooks.inject.config import parse_config
from meshpilot.webhooks.inject.review import InjectionHandler, InjectionMetrics
from meshpilot.webhooks.server import WebhookServer

REVIEWS = 10_000
#: Log bytes the server may write per bad review on average (a denial is logged as one clipped line).
LOG_BYTES_PER_REVIEW = 400

POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "hello", "namespace": "default", "labels": {"app": "hello"}, "annotations": {}},
    "spec": {
        "containers": [
            {
                "name": "hello",
                "image": "hello:1",
                "ports": [{"containerPort": 80, "name": "http"}],
                "readinessProbe": {"httpGet": {"path": "/", "port": 80}},
            }
        ]
    },
}
ANNOTATIONS = [
    "proxy.istio.io/config",
    "proxy.istio.io/overrides",
    "sidecar.istio.io/userVolume",
    "sidecar.istio.io/userVolumeMount",
    "sidecar.istio.io/proxyCPU",
    "sidecar.istio.io/proxyMemory",
    "sidecar.istio.io/proxyCPULimit",
    "sidecar.istio.io/proxyMemoryLimit",
    "sidecar.istio.io/interceptionMode",
    "sidecar.istio.io/rewriteAppHTTPProbers",
    "sidecar.istio.io/inject",
    "sidecar.istio.io/logLevel",
    "sidecar.istio.io/componentLogLevel",
    "sidecar.istio.io/proxyImage",
    "status.sidecar.istio.io/port",
    "readiness.status.sidecar.istio.io/initialDelaySeconds",
    "readiness.status.sidecar.istio.io/periodSeconds",
    "readiness.status.sidecar.istio.io/failureThreshold",
    "traffic.sidecar.istio.io/includeInboundPorts",
    "traffic.sidecar.istio.io/excludeInboundPorts",
    "traffic.sidecar.istio.io/includeOutboundPorts",
    "traffic.sidecar.istio.io/excludeOutboundPorts",
    "traffic.sidecar.istio.io/includeOutboundIPRanges",
    "traffic.sidecar.istio.io/excludeOutboundIPRanges",
    "traffic.sidecar.istio.io/kubevirtInterfaces",
    "prometheus.io/port",
    "prometheus.io/scrape",
    "prometheus.io/path",
    "prometheus.istio.io/merge-metrics",
    "k8s.v1.cni.cncf.io/networks",
]


def _values(rng: random.Random) -> list[Any]:
    return [
        "{" * 3000 + "}" * 3000,
        '{"a":' * 500 + "1" + "}" * 500,
        "[" * 200 + "]" * 200,
        "a:\n" + "".join("  " * i + "b:\n" for i in range(1, 300)),
        "a: &x [1, 2]\nb: *x\n",
        "1" * 1_000_000,
        "1e999999999",
        "1" * 5000 + "m",
        "\u00b2",
        "\u0663",
        "-1",
        "",
        "*",
        "0",
        "65536",
        "100m",
        "1Gi",
        "8080,9090",
        "10.0.0.0/8",
        "true",
        "null",
        '{"hello": {"mountPath": "/x"}}',
        '{"containers": [{"name": "istio-proxy", "resources": 5}]}',
        "concurrency: 2\nproxyMetadata: {A: b}",
        "drainDuration: 99999999999999999999s",
        "\n\r\t\x00",
        rng.randbytes(rng.randrange(1, 40)).decode("latin-1"),
        "x" * 70_000,
    ]


def _junk(rng: random.Random) -> Any:
    return rng.choice(
        [None, True, 0, -1, 2**70, 1.5, "", "x", [], [1, "a"], {}, {"a": {"b": []}}, "1" * 5000, [[[[]]]]]
    )


def _mutate(rng: random.Random, value: Any, depth: int = 0) -> Any:
    """``value`` with one node somewhere below it replaced by junk of another type."""
    if depth > 0 and (rng.random() < 0.3 or not isinstance(value, dict | list) or not value):
        return _junk(rng)
    if isinstance(value, dict) and value:
        key = rng.choice(list(value))
        value[key] = _mutate(rng, value[key], depth + 1)
    elif isinstance(value, list) and value:
        i = rng.randrange(len(value))
        value[i] = _mutate(rng, value[i], depth + 1)
    return value


def _review(rng: random.Random) -> tuple[str, bytes, str]:
    """(path, body, content type) of one random review."""
    pod = copy.deepcopy(POD)
    values = _values(rng)
    for _ in range(rng.randrange(0, 4)):
        key = rng.choice([*ANNOTATIONS, f"x.io/{rng.getrandbits(32):x}"])
        pod["metadata"]["annotations"][key] = rng.choice(values)
    if rng.random() < 0.3:
        pod = _mutate(rng, pod)
    group, version, resource = "", "v1", "pods"
    if rng.random() < 0.3:  # made up: each would be a metric series if labelled as sent
        group, version, resource = (f"g{rng.getrandbits(40):x}.io", f"v{rng.randrange(99)}", "x" * 3)
    request: Any = {
        "uid": f"uid-{rng.getrandbits(32)}",
        "kind": {"group": group, "version": version, "kind": "Pod"},
        "resource": {"group": group, "version": version, "resource": resource},
        "namespace": "default",
        "operation": rng.choice(["CREATE", "CREATE", "UPDATE", "DELETE", "X"]),
        "object": pod,
    }
    path = rng.choice(["/inject", "/inject", "/validate", "/inject/x", "/validate/y"])
    if path.startswith("/validate") and rng.random() < 0.7:
        request["object"] = _validation_object(rng)
        request["resource"] = {
            "group": "networking.istio.io",
            "version": rng.choice(["v1", "v1beta1", "v1alpha3", f"v{rng.getrandbits(20)}"]),
            "resource": rng.choice(["virtualservices", "gateways", f"r{rng.getrandbits(40):x}"]),
        }
    review: Any = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    if rng.random() < 0.15:
        review = _mutate(rng, review)
    body = json.dumps(review).encode()  # Python's: orjson refuses integers past 64 bits
    roll = rng.random()
    if roll < 0.03:
        body = body[: rng.randrange(len(body))]
    elif roll < 0.05:
        body = rng.randbytes(rng.randrange(0, 200))
    elif roll < 0.06:
        body = b"[" * 100_000 + b"]" * 100_000
    content_type = "application/json" if rng.random() < 0.97 else rng.choice(["text/plain", ""])
    return path, body, content_type


def _validation_object(rng: random.Random) -> Any:
    obj = {
        "apiVersion": "networking.istio.io/v1",
        "kind": rng.choice(["VirtualService", "Gateway", "DestinationRule", "Nope"]),
        "metadata": {"name": "vs", "namespace": "default"},
        "spec": {
            "hosts": ["reviews"],
            "http": [{"match": [{"uri": {"regex": rng.choice(["(" * 2000 + ")" * 2000, "a+", "[" * 5])}}]}],
        },
    }
    return _mutate(rng, obj) if rng.random() < 0.3 else obj


@pytest.fixture
async def webhooks() -> AsyncIterator[tuple[WebhookServer, Metrics]]:
    metrics = Metrics()
    server = WebhookServer(Address("127.0.0.1", free_port("127.0.0.1")), metrics, lambda: True)
    handler = InjectionHandler(parse_config("policy: enabled\n"), InjectionMetrics.create(metrics.registry))
    server.add_review_handler("/inject", handler)
    await server.start()
    try:
        yield server, metrics
    finally:
        await server.stop()


def _check(status: int, body: bytes, where: str) -> str:
    """The outcome of one answer ("allowed", "denied" or the status), failing on what is not proper."""
    assert status in (200, 400, 413, 415), f"{where}: HTTP {status}: {body[:300]!r}"
    if status != 200:
        return str(status)
    review = orjson.loads(body)
    response = review["response"]
    assert isinstance(response["allowed"], bool), f"{where}: {response}"
    if response["allowed"]:
        return "allowed"
    message = response["status"]["message"]
    assert "internal error" not in message, f"{where}: {message[:500]}"
    assert len(message) <= 4200, f"{where}: a denial of {len(message)} characters"
    return "denied"


async def test_ten_thousand_bad_reviews_get_proper_answers(webhooks: tuple[WebhookServer, Metrics]) -> None:
    server, metrics = webhooks
    base = f"https://127.0.0.1:{server.address.port}"
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    outcomes: dict[str, int] = {}
    before = series(metrics.exposition())
    started = time.monotonic()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context, limit=4)) as session:

        async def send(i: int) -> None:
            path, body, content_type = _review(random.Random(i))  # made when sent: some are 1 MB
            headers = {"Content-Type": content_type} if content_type else {}
            async with session.post(base + path, data=io.BytesIO(body), headers=headers) as answer:
                outcome = _check(answer.status, await answer.read(), f"review {i} to {path}")
            outcomes[outcome] = outcomes.get(outcome, 0) + 1

        with log_volume() as logs:
            for start in range(0, REVIEWS, 50):
                await asyncio.gather(*(send(i) for i in range(start, min(REVIEWS, start + 50))))
        # One oversized body, refused without being read whole.
        async with session.post(
            base + "/inject",
            data=io.BytesIO(b" " * (6 * 1024 * 1024 + 1)),
            headers={"Content-Type": "application/json"},
        ) as answer:
            assert answer.status == 413
    elapsed = time.monotonic() - started

    assert not logs.tracebacks, f"tracebacks logged: {logs.tracebacks[:3]}"
    per_review = logs.bytes / REVIEWS
    assert per_review <= LOG_BYTES_PER_REVIEW, f"{per_review:.0f} log bytes per review"
    assert logs.longest <= 2_000, f"a log line of {logs.longest} bytes"
    exposition = metrics.exposition()
    grown = series(exposition) - before
    # Bounded by Istio's own (group, version, resource) triples times the reasons, whatever was sent:
    # no made-up group, version or resource became a label.
    assert grown <= 150, f"{grown} new metric series"
    made_up = re.findall(rb'(?:group="g[0-9a-f]+\.io"|resource="r[0-9a-f]+"|version="v\d{3,}")', exposition)
    assert not made_up, made_up[:5]
    assert outcomes.get("denied", 0) > REVIEWS // 10 and outcomes.get("allowed", 0) > REVIEWS // 10
    print(
        f"{REVIEWS} reviews in {elapsed:.1f}s: {outcomes}; {logs.bytes} log bytes "
        f"({per_review:.0f}/review, longest line {logs.longest}); {grown} new series"
    )
