"""The debug types istioctl asks for (sync status, config dump, debug pages by name), against a fake
server: who may ask, what each answers, and that nothing is kept for a push."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from envoy.admin.v3 import config_dump_pb2, config_dump_shared_pb2
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2, tls_pb2
from envoy.service.status.v3 import csds_pb2
from google.protobuf import any_pb2
from support.envoy_filters import envoy_filter
from support.kube import workload
from support.model import Model, build

from meshpilot.model.endpoint_index import EndpointIndex
from meshpilot.model.proxy import Proxy
from meshpilot.model.push_context import PushContext
from meshpilot.model.push_request import PushRequest, TriggerReason
from meshpilot.xds.config_dump import config_dump
from meshpilot.xds.connection import Connection, WatchedResource
from meshpilot.xds.debug_access import DebugAccess, DebugRefused, judged_identity
from meshpilot.xds.generators import Generator, Resource, sidecar_generators
from meshpilot.xds.generators.base import GenerationContext
from meshpilot.xds.generators.debug import debug_generators
from meshpilot.xds.redaction import REDACTED
from meshpilot.xds.sync_status import config_status
from meshpilot.xds.types import TypeUrl

SYSTEM = "spiffe://cluster.local/ns/istio-system/sa/default"
DEFAULT_NS = "spiffe://cluster.local/ns/default/sa/default"
OTHER_NS = "spiffe://cluster.local/ns/other/sa/default"
PROXY_CONFIG = {"PROXY_CONFIG": {"concurrency": 2}}


class _Secrets:
    """An SDS stand-in serving one certificate with its key."""

    type_url = TypeUrl.SECRET

    def needs_push(self, request: PushRequest) -> bool:
        return False

    def generate(self, ctx: GenerationContext, watch: WatchedResource, names: Any) -> list[Resource]:
        secret = secret_pb2.Secret(name="kubernetes://cert")
        secret.tls_certificate.private_key.inline_bytes = b"KEY"
        secret.tls_certificate.certificate_chain.inline_bytes = b"CHAIN"
        return [Resource.of("kubernetes://cert", secret)]


@dataclass
class FakeServer:
    """``ConnectedProxies`` and ``DebugPages`` in one: connections, a snapshot, the pages asked for."""

    model: Model
    connections: dict[str, Connection] = field(default_factory=dict)
    rendered: list[tuple[str, dict[str, str], str]] = field(default_factory=list)

    @property
    def push_context(self) -> PushContext:
        return self.model.push

    @property
    def index(self) -> EndpointIndex:
        return self.model.index

    def generators_for(self, proxy: Proxy) -> Mapping[TypeUrl, Generator]:
        return {**sidecar_generators(), TypeUrl.SECRET: _Secrets()}

    def render(self, page: str, query: Mapping[str, str], scope: str) -> tuple[int, bytes]:
        self.rendered.append((page, dict(query), scope))
        return 200, b'{"page": "%s"}' % page.encode()

    def connect(self, pod: str, namespace: str, metadata: Mapping[str, Any] = PROXY_CONFIG) -> Connection:
        proxy = self.model.proxy(
            f"sidecar~127.0.0.9~{pod}.{namespace}~{namespace}.svc.cluster.local", metadata
        )
        conn = Connection(proxy=proxy, peer="ipv4:127.0.0.9:1")
        self.connections[conn.id] = conn
        return conn


def _fake_server(*extra: Mapping[str, Any]) -> FakeServer:
    docs = [
        *workload("reviews", "default", "10.96.0.20", 9080, {"reviews-v1": "127.0.0.21"}),
        *workload("ratings", "other", "10.96.0.30", 9080, {"ratings-v1": "127.0.0.31"}),
        *extra,
    ]
    return FakeServer(build(docs))


@pytest.fixture
def server() -> FakeServer:
    fake = _fake_server()
    reviews = fake.connect("reviews-v1", "default")
    reviews.watched[TypeUrl.CLUSTER] = WatchedResource(
        TypeUrl.CLUSTER, wildcard=True, nonce_sent="n1", nonce_acked="n1", last_sent=1_700_000_000.5
    )
    reviews.watched[TypeUrl.LISTENER] = WatchedResource(TypeUrl.LISTENER, wildcard=True, nonce_sent="n2")
    ratings = fake.connect("ratings-v1", "other")
    ratings.watched[TypeUrl.CLUSTER] = WatchedResource(
        TypeUrl.CLUSTER, wildcard=True, nonce_sent="n3", nonce_acked="n2", last_error="bad cluster"
    )
    # istioctl's own stream: no PROXY_CONFIG, so never listed.
    fake.connect("test-1", "istio-system", {"GENERATOR": "event"})
    return fake


def _ask(
    server: FakeServer,
    type_url: TypeUrl,
    names: frozenset[str] = frozenset(),
    *,
    identity: str = SYSTEM,
    access: DebugAccess | None = None,
) -> list[Resource]:
    generators = debug_generators(server, server, access or DebugAccess())
    caller = server.connections[next(c for c in server.connections if c.startswith("test-1"))]
    request = PushRequest(full=True, reasons=Counter({TriggerReason.DEBUG: 1}), push=server.model.push)
    ctx = GenerationContext(caller.proxy, server.model.push, server.model.index, request, identity=identity)
    return generators[type_url].generate(ctx, WatchedResource(type_url, names=names), None) or []


def _client_configs(resources: list[Resource]) -> dict[str, Any]:
    out = {}
    for resource in resources:
        config = csds_pb2.ClientConfig()
        resource.message().Unpack(config)
        out[resource.name] = config
    return out


def test_syncz_lists_proxies_with_their_status_per_type(server: FakeServer) -> None:
    configs = _client_configs(_ask(server, TypeUrl.DEBUG_SYNCZ))
    assert list(configs) == ["ratings-v1.other", "reviews-v1.default"]
    reviews = configs["reviews-v1.default"]
    assert reviews.node.id == "reviews-v1.default"
    # The three fields istiod copies, those the node sent (this one names no cluster).
    assert dict(reviews.node.metadata) == {"NAMESPACE": "default", "ISTIO_VERSION": "1.28.0"}
    by_type = {c.type_url: c for c in reviews.generic_xds_configs}
    assert list(by_type) == sorted(by_type)
    assert by_type[TypeUrl.CLUSTER].config_status == csds_pb2.SYNCED
    assert by_type[TypeUrl.CLUSTER].last_updated.ToNanoseconds() == 1_700_000_000_500_000_000
    assert by_type[TypeUrl.LISTENER].config_status == csds_pb2.STALE
    [ratings] = configs["ratings-v1.other"].generic_xds_configs
    assert ratings.config_status == csds_pb2.ERROR
    assert ratings.error_state.details == "bad cluster"


def test_config_status_rule() -> None:
    assert config_status(WatchedResource("t")) == csds_pb2.NOT_SENT
    assert config_status(WatchedResource("t", nonce_sent="a")) == csds_pb2.STALE
    assert config_status(WatchedResource("t", nonce_sent="a", nonce_acked="a")) == csds_pb2.SYNCED
    assert (
        config_status(WatchedResource("t", nonce_sent="a", nonce_acked="a", last_error="x")) == csds_pb2.ERROR
    )


def test_sync_status_needs_an_identity_unless_debug_auth_is_off(server: FakeServer) -> None:
    with pytest.raises(DebugRefused) as refused:
        _ask(server, TypeUrl.DEBUG_SYNCZ, identity="")
    assert refused.value.code is grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(DebugRefused):
        _ask(server, TypeUrl.DEBUG_CONFIG_DUMP, frozenset({"reviews-v1.default"}), identity="")
    assert len(_ask(server, TypeUrl.DEBUG_SYNCZ, identity="", access=DebugAccess(enabled=False))) == 2


def test_an_identity_outside_the_system_namespace_sees_its_own_namespace(server: FakeServer) -> None:
    assert list(_client_configs(_ask(server, TypeUrl.DEBUG_SYNCZ, identity=DEFAULT_NS))) == [
        "reviews-v1.default"
    ]
    assert _ask(server, TypeUrl.DEBUG_CONFIG_DUMP, frozenset({"ratings-v1.other"}), identity=DEFAULT_NS) == []
    allowed = DebugAccess(allowed_namespaces=frozenset({"default"}))
    assert len(_ask(server, TypeUrl.DEBUG_SYNCZ, identity=DEFAULT_NS, access=allowed)) == 2


def test_config_dump_is_the_proxys_config_in_istiods_sections(server: FakeServer) -> None:
    conn = next(c for c in server.connections.values() if c.proxy.id == "reviews-v1.default")
    conn.watched[TypeUrl.SECRET] = WatchedResource(TypeUrl.SECRET, names=frozenset({"kubernetes://cert"}))
    resources = _ask(server, TypeUrl.DEBUG_CONFIG_DUMP, frozenset({"reviews-v1.default"}))
    sections = [r.message() for r in resources]
    assert [r.name for r in resources] == [""] * len(resources)
    assert [s.type_url.rsplit(".", 1)[1] for s in sections] == [
        "BootstrapConfigDump",
        "ClustersConfigDump",
        "ListenersConfigDump",
        "ScopedRoutesConfigDump",
        "RoutesConfigDump",
        "SecretsConfigDump",
        "EcdsConfigDump",
    ]
    clusters = config_dump_shared_pb2.ClustersConfigDump()
    sections[1].Unpack(clusters)
    names = set()
    for entry in clusters.dynamic_active_clusters:
        cluster = cluster_pb2.Cluster()
        entry.cluster.Unpack(cluster)
        names.add(cluster.name)
    assert "outbound|9080||ratings.other.svc.cluster.local" in names
    # The same generators as a push: the dump is what the proxy was sent.
    generated = sidecar_generators()[TypeUrl.CLUSTER].generate(
        GenerationContext(conn.proxy, server.model.push, server.model.index, PushRequest(full=True)),
        conn.watched[TypeUrl.CLUSTER],
        None,
    )
    assert names == {r.name for r in generated or []}
    secrets = config_dump_pb2.SecretsConfigDump()
    sections[5].Unpack(secrets)
    [dumped] = secrets.dynamic_active_secrets
    secret = secret_pb2.Secret()
    dumped.secret.Unpack(secret)
    assert secret.tls_certificate.private_key.inline_bytes == REDACTED.encode()
    assert secret.tls_certificate.certificate_chain.inline_bytes == b"CHAIN"


def test_config_dump_with_endpoints_when_asked(server: FakeServer) -> None:
    conn = next(c for c in server.connections.values() if c.proxy.id == "reviews-v1.default")
    dump = config_dump(server, conn, server.model.push, include_eds=True)
    assert [c.type_url.rsplit(".", 1)[1] for c in dump.configs][:3] == [
        "BootstrapConfigDump",
        "ClustersConfigDump",
        "EndpointsConfigDump",
    ]


def test_config_dump_of_an_unknown_proxy_or_without_one_name_is_empty(server: FakeServer) -> None:
    assert _ask(server, TypeUrl.DEBUG_CONFIG_DUMP, frozenset({"nobody.default"})) == []
    assert _ask(server, TypeUrl.DEBUG_CONFIG_DUMP) == []
    assert _ask(server, TypeUrl.DEBUG_CONFIG_DUMP, frozenset({"a", "b"})) == []


def test_debug_pages_by_name(server: FakeServer) -> None:
    [resource] = _ask(
        server, TypeUrl.DEBUG, frozenset({"config_dump?proxyID=reviews-v1.default&include_eds"})
    )
    assert resource.name == "config_dump?proxyID=reviews-v1.default&include_eds"
    packed = any_pb2.Any.FromString(resource.payload)
    assert packed.type_url == "istio.io/debug"
    assert packed.value == b'{"page": "config_dump"}'
    assert server.rendered == [("config_dump", {"proxyID": "reviews-v1.default", "include_eds": ""}, "")]


def test_debug_pages_need_an_identity_and_outside_the_system_namespace_only_per_proxy_pages(
    server: FakeServer,
) -> None:
    for identity, access in (("", DebugAccess()), ("", DebugAccess(enabled=False))):
        with pytest.raises(DebugRefused) as refused:
            _ask(server, TypeUrl.DEBUG, frozenset({"syncz"}), identity=identity, access=access)
        assert refused.value.code is grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(DebugRefused) as refused:
        _ask(server, TypeUrl.DEBUG, frozenset({"syncz"}), identity=OTHER_NS)
    assert refused.value.code is grpc.StatusCode.PERMISSION_DENIED
    _ask(server, TypeUrl.DEBUG, frozenset({"config_dump?proxyID=x"}), identity=OTHER_NS)
    assert server.rendered[-1][2] == "other"
    with pytest.raises(DebugRefused) as refused:
        _ask(server, TypeUrl.DEBUG, frozenset({"a", "b"}))
    assert refused.value.code is grpc.StatusCode.INVALID_ARGUMENT


def test_allowed_namespaces_and_the_auth_switch_mean_over_xds_what_they_mean_over_http(
    server: FakeServer,
) -> None:
    allowed = DebugAccess(allowed_namespaces=frozenset({"other"}))
    _ask(server, TypeUrl.DEBUG, frozenset({"syncz"}), identity=OTHER_NS, access=allowed)
    assert server.rendered[-1] == ("syncz", {}, "")
    off = DebugAccess(enabled=False)
    _ask(server, TypeUrl.DEBUG, frozenset({"configz"}), identity=OTHER_NS, access=off)
    assert server.rendered[-1] == ("configz", {}, "")
    _ask(server, TypeUrl.DEBUG, frozenset({"config_dump?proxyID=x"}), identity=OTHER_NS)
    assert server.rendered[-1][2] == "other"


def test_an_identity_without_a_namespace_is_refused() -> None:
    access = DebugAccess()
    with pytest.raises(DebugRefused) as refused:
        access.page_scope("someone@example.com", "config_dump", "istio-system")
    assert refused.value.code is grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(DebugRefused) as refused:
        access.status_scope("", "istio-system")
    assert refused.value.code is grpc.StatusCode.UNAUTHENTICATED
    assert judged_identity(("someone@example.com", DEFAULT_NS)) == DEFAULT_NS
    assert judged_identity(("someone@example.com",)) == "someone@example.com"
    assert judged_identity(()) == ""


DOWNSTREAM_TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext"
KEY = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\n"


def test_config_dump_hides_what_an_envoy_filter_inlined_into_a_listener() -> None:
    tls = {
        "@type": DOWNSTREAM_TLS,
        "common_tls_context": {
            "tls_certificates": [
                {
                    "certificate_chain": {"inline_string": "CHAIN"},
                    "private_key": {"inline_string": KEY},
                    "password": {"inline_bytes": "aHVudGVyMg=="},
                }
            ]
        },
    }
    listener = {
        "name": "inline-tls",
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": 8443}},
        "metadata": {"filter_metadata": {"example": {"api_token": "t0k3n", "note": KEY, "owner": "team-a"}}},
        "filter_chains": [{"transport_socket": {"name": "envoy.transport_sockets.tls", "typed_config": tls}}],
    }
    patch = {"applyTo": "LISTENER", "patch": {"operation": "ADD", "value": listener}}
    server = _fake_server(envoy_filter("inline-tls", "istio-system", [patch]))
    conn = server.connect("reviews-v1", "default")
    conn.watched[TypeUrl.LISTENER] = WatchedResource(TypeUrl.LISTENER, wildcard=True)
    server.connect("test-1", "istio-system", {"GENERATOR": "event"})

    resources = _ask(server, TypeUrl.DEBUG_CONFIG_DUMP, frozenset({"reviews-v1.default"}))
    assert all(b"PRIVATE KEY" not in r.payload and b"t0k3n" not in r.payload for r in resources)
    listeners = config_dump_shared_pb2.ListenersConfigDump()
    resources[2].message().Unpack(listeners)
    [entry] = [e for e in listeners.dynamic_listeners if e.name == "inline-tls"]
    dumped = listener_pb2.Listener()
    entry.active_state.listener.Unpack(dumped)
    context = tls_pb2.DownstreamTlsContext()
    dumped.filter_chains[0].transport_socket.typed_config.Unpack(context)
    [certificate] = context.common_tls_context.tls_certificates
    assert certificate.private_key.inline_string == REDACTED
    assert certificate.password.inline_bytes == REDACTED.encode()
    assert certificate.certificate_chain.inline_string == "CHAIN"
    metadata = dumped.metadata.filter_metadata["example"]
    assert metadata["api_token"] == metadata["note"] == REDACTED
    assert metadata["owner"] == "team-a"
    # Hidden in the dump's copy only: what the proxy is sent is untouched.
    ctx = GenerationContext(conn.proxy, server.model.push, server.model.index, PushRequest(full=True))
    sent = sidecar_generators()[TypeUrl.LISTENER].generate(ctx, conn.watched[TypeUrl.LISTENER], None)
    assert any(b"PRIVATE KEY" in r.payload for r in sent or [])


def test_debug_types_are_never_pushed(server: FakeServer) -> None:
    everything = PushRequest(full=True, forced=True, reasons=Counter({TriggerReason.GLOBAL: 1}))
    for generator in debug_generators(server, server, DebugAccess()).values():
        assert generator.type_url.is_debug
        assert not generator.needs_push(everything)
    assert not TypeUrl.CLUSTER.is_debug
