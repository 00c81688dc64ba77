"""Debug types over both ADS protocols, in-process: answered at once, nothing kept, never pushed,
the control plane named in sync status, and plaintext refused while debug auth is on."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.service.status.v3 import csds_pb2
from support.ads_client import refusal
from support.envoy_filters import envoy_filter
from support.kube import workload, write
from support.xds_server import NODE, Server, running, settings_for

from meshpilot import __version__
from meshpilot.xds.types import TypeUrl

CDS = TypeUrl.CLUSTER.value
SYNCZ = TypeUrl.DEBUG_SYNCZ.value
ISTIOCTL = "sidecar~127.0.0.99~test-1.istio-system~istio-system.svc.cluster.local"
ISTIOCTL_META = {"GENERATOR": "event", "NAMESPACE": "istio-system", "SERVICE_ACCOUNT": "default"}


async def _serve(
    tmp_path: Path, *, auth: bool, extra: Sequence[Mapping[str, Any]] = ()
) -> AsyncIterator[Server]:
    config = tmp_path / "config"
    write(
        config / "apps.yaml", workload("reviews", "default", "10.96.0.20", 9080, {"reviews-v1": "127.0.0.21"})
    )
    if extra:
        write(config / "extra.yaml", list(extra))
    settings = settings_for(config, debug_endpoint_auth=auth, secure_grpc_addr=None, pod_name="istiod-1")
    async with running(settings) as app:
        yield Server(app, config)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    async for served in _serve(tmp_path, auth=False):
        yield served


@pytest.fixture
async def guarded(tmp_path: Path) -> AsyncIterator[Server]:
    async for served in _serve(tmp_path, auth=True):
        yield served


async def test_sotw_syncz_is_answered_names_the_control_plane_and_keeps_no_watch(server: Server) -> None:
    proxy = server.client()
    proxy.send(CDS, node_id=NODE, node_metadata={"PROXY_CONFIG": {}})
    proxy.ack(await proxy.recv())
    istioctl = server.client()
    istioctl.send(SYNCZ, node_id=ISTIOCTL, node_metadata=ISTIOCTL_META, nonce="first-request-nonce")
    response = await istioctl.recv()
    assert response.type_url == SYNCZ and response.nonce
    identifier = json.loads(response.control_plane.identifier)
    assert identifier["Component"] == "istiod" and identifier["ID"] == "istiod-1"
    assert identifier["Info"]["version"] == __version__
    [resource] = response.resources
    config = csds_pb2.ClientConfig()
    resource.Unpack(config)
    assert config.node.id == "productpage-v1.default"
    assert [(c.type_url, c.config_status) for c in config.generic_xds_configs] == [(CDS, csds_pb2.SYNCED)]
    [conn] = [c for c in server.app.server.connections.values() if c.proxy.id == "test-1.istio-system"]
    assert conn.watched == {}, "a debug request keeps no watch"
    server.app.server.push_all()
    assert await istioctl.no_response(), "pushes never send debug types"
    await istioctl.close()
    await proxy.close()


async def test_delta_config_dump_is_answered_once(server: Server) -> None:
    proxy = server.client()
    proxy.send(CDS, node_id=NODE, node_metadata={"PROXY_CONFIG": {}})
    proxy.ack(await proxy.recv())
    istioctl = server.delta_client()
    istioctl.send(
        TypeUrl.DEBUG_CONFIG_DUMP.value,
        ["productpage-v1.default"],
        node_id=ISTIOCTL,
        node_metadata=ISTIOCTL_META,
    )
    response = await istioctl.recv()
    assert not response.HasField("control_plane")
    kinds = [r.resource.type_url.rsplit(".", 1)[1] for r in response.resources]
    assert kinds[:2] == ["BootstrapConfigDump", "ClustersConfigDump"]
    assert await istioctl.no_response()
    await istioctl.close()
    await proxy.close()


async def test_plaintext_sync_status_is_refused_while_debug_auth_is_on(guarded: Server) -> None:
    def ask(client) -> None:  # type: ignore[no-untyped-def]
        client.send(SYNCZ, node_id=ISTIOCTL, node_metadata=ISTIOCTL_META)

    err = await refusal(guarded.target, ask)
    assert err.code() is grpc.StatusCode.UNAUTHENTICATED
    assert guarded.metric("meshpilot_xds_refused_requests_total", reason="debug") >= 1


DOWNSTREAM_TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext"
KEY = "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIB\n-----END EC PRIVATE KEY-----\n"
TLS_LISTENER = {
    "name": "inline-tls",
    "address": {"socket_address": {"address": "0.0.0.0", "port_value": 8443}},
    "filter_chains": [
        {
            "transport_socket": {
                "name": "envoy.transport_sockets.tls",
                "typed_config": {
                    "@type": DOWNSTREAM_TLS,
                    "common_tls_context": {"tls_certificates": [{"private_key": {"inline_string": KEY}}]},
                },
            }
        }
    ],
}


async def test_config_dump_over_xds_hides_a_key_inlined_into_a_listener(tmp_path: Path) -> None:
    patch = {"applyTo": "LISTENER", "patch": {"operation": "ADD", "value": TLS_LISTENER}}
    async for served in _serve(tmp_path, auth=False, extra=[envoy_filter("tls", "istio-system", [patch])]):
        proxy = served.client()
        proxy.send(CDS, node_id=NODE, node_metadata={"PROXY_CONFIG": {}})
        proxy.ack(await proxy.recv())
        proxy.send(TypeUrl.LISTENER.value)
        listeners = await proxy.recv()
        assert any(b"PRIVATE KEY" in r.value for r in listeners.resources), "the proxy gets its key"
        istioctl = served.client()
        istioctl.send(
            TypeUrl.DEBUG_CONFIG_DUMP.value,
            ["productpage-v1.default"],
            node_id=ISTIOCTL,
            node_metadata=ISTIOCTL_META,
        )
        response = await istioctl.recv()
        dump = b"".join(r.value for r in response.resources)
        assert b"inline-tls" in dump and b"[redacted]" in dump and b"PRIVATE KEY" not in dump
        await istioctl.close()
        await proxy.close()
