"""The Sidecar resource and exportTo, shown with real Envoys and real traffic on loopback.

Every client sidecar runs with INTERCEPTION_MODE NONE, selected by its own
Sidecar whose egress listener binds the client's address, so the test calls
``<client IP>:9080`` with a Host header, as the app would. Addresses are in
127.0.93.0/24, apart from the other suites' (they may run at the same time).
"""

from __future__ import annotations

import json
import socketserver
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from support.kube import istio, pod, workload
from support.processes import backend_name, free_port, http_get
from support.wait import eventually

pytestmark = [pytest.mark.envoy, pytest.mark.integration]

SUFFIX = "svc.cluster.local"


def client_sidecar(name: str, namespace: str, ip: str, hosts: list[str], **extra: Any) -> dict[str, Any]:
    """A Sidecar selecting pods labelled app=<name>, its egress listener bound to ``ip``."""
    spec = {"workloadSelector": {"labels": {"app": name}}, "egress": [{"bind": ip, "hosts": hosts}], **extra}
    return istio("Sidecar", name, namespace, spec)


def call(ip: str, host: str, port: int = 9080) -> tuple[int, str]:
    return backend_name(ip, host, port)


def spread(ip: str, host: str, n: int = 20) -> Counter[str]:
    return Counter(call(ip, host)[1] for _ in range(n))


def outbound_clusters(envoy: Any) -> set[str]:
    return {c for c in envoy.dynamic_clusters() if c.startswith("outbound|")}


def route_vhosts(envoy: Any, route: str) -> set[str]:
    for config in envoy.config_dump()["configs"]:
        if config["@type"].endswith("RoutesConfigDump"):
            for item in config.get("dynamic_route_configs", []):
                if item["route_config"]["name"] == route:
                    return {v["name"] for v in item["route_config"].get("virtual_hosts", [])}
    return set()


def passthrough_requests(envoy: Any) -> int:
    """Requests the PassthroughCluster took (istiod's stat name for it ends in ``;``)."""
    stats = envoy.stats()
    return sum(stats.get(f"cluster.{name}.upstream_rq_completed", 0) for name in PASSTHROUGH_STAT_NAMES)


PASSTHROUGH_STAT_NAMES = ("PassthroughCluster", "PassthroughCluster;")


def services() -> list[dict[str, Any]]:
    return [
        *workload("reviews", "default", "10.96.0.20", 9080, {"reviews-v1": "127.0.93.21"}),
        *workload("billing", "payments", "10.96.0.50", 9080, {"billing-v1": "127.0.93.51"}),
        *workload("ledger", "payments", "10.96.0.55", 9080, {"ledger-v1": "127.0.93.55"}),
        *workload("search", "tools", "10.96.0.60", 9080, {"search-v1": "127.0.93.61"}),
    ]


def start_backends(mesh: Any) -> None:
    for name, ip in [
        ("reviews-v1", "127.0.93.21"),
        ("billing-v1", "127.0.93.51"),
        ("ledger-v1", "127.0.93.55"),
        ("search-v1", "127.0.93.61"),
    ]:
        mesh.backend(name, ip, 9080)


REVIEWS = f"reviews.default.{SUFFIX}"
BILLING = f"billing.payments.{SUFFIX}"
LEDGER = f"ledger.payments.{SUFFIX}"
SEARCH = f"search.tools.{SUFFIX}"


def test_egress_hosts_limit_clusters_and_reachability(mesh):
    mesh.write("apps.yaml", services())
    clients = {
        # name: (address, egress hosts)
        "by-namespace": ("127.0.93.11", ["payments/*"]),
        "by-host": ("127.0.93.12", [f"*/{SEARCH}"]),
        "nothing": ("127.0.93.13", ["~/*"]),
    }
    mesh.write(
        "clients.yaml",
        [
            doc
            for name, (ip, hosts) in clients.items()
            for doc in (
                pod(f"{name}-1", "default", ip, {"app": name}),
                client_sidecar(name, "default", ip, hosts),
            )
        ],
    )
    start_backends(mesh)
    mesh.start_meshpilot()
    envoys = {
        name: mesh.sidecar(f"{name}-1", ip, labels={"app": name}, service_account=name)
        for name, (ip, _) in clients.items()
    }

    by_namespace = envoys["by-namespace"]
    assert outbound_clusters(by_namespace) == {f"outbound|9080||{BILLING}", f"outbound|9080||{LEDGER}"}
    assert call("127.0.93.11", "billing.payments") == (200, "billing-v1")
    assert call("127.0.93.11", LEDGER) == (200, "ledger-v1")
    # Out of scope: no virtual host, so the catch-all (ALLOW_ANY) hands it to the
    # PassthroughCluster, which has no original destination on a bound listener.
    before = passthrough_requests(by_namespace)
    status, body = call("127.0.93.11", REVIEWS)
    assert status != 200 and "reviews" not in body
    assert passthrough_requests(by_namespace) == before + 1
    assert route_vhosts(by_namespace, "9080") == {f"{BILLING}:9080", f"{LEDGER}:9080", "allow_any"}

    by_host = envoys["by-host"]
    assert outbound_clusters(by_host) == {f"outbound|9080||{SEARCH}"}
    assert call("127.0.93.12", "search.tools") == (200, "search-v1")
    assert call("127.0.93.12", BILLING)[0] != 200

    nothing = envoys["nothing"]
    assert outbound_clusters(nothing) == set()
    # Nothing imported, so no outbound listener: the port is not even open.
    with pytest.raises(ConnectionRefusedError):
        http_get("127.0.93.13", 9080, "/", {"Host": REVIEWS}, timeout=2)

    for envoy in envoys.values():
        assert envoy.rejected_updates() == {}


@pytest.mark.parametrize("mesh_mode", ["REGISTRY_ONLY", "ALLOW_ANY"])
def test_outbound_traffic_policy_of_the_mesh_and_of_a_sidecar(mesh, tmp_path, mesh_mode):
    other = "ALLOW_ANY" if mesh_mode == "REGISTRY_ONLY" else "REGISTRY_ONLY"
    mesh_config = tmp_path / "mesh.yaml"
    mesh_config.write_text(f"outboundTrafficPolicy:\n  mode: {mesh_mode}\n")
    mesh.write("apps.yaml", services())
    mesh.write(
        "clients.yaml",
        [
            pod("plain-1", "default", "127.0.93.11", {"app": "plain"}),
            client_sidecar("plain", "default", "127.0.93.11", ["./*"]),
            pod("override-1", "default", "127.0.93.12", {"app": "override"}),
            client_sidecar(
                "override", "default", "127.0.93.12", ["./*"], outboundTrafficPolicy={"mode": other}
            ),
        ],
    )
    start_backends(mesh)
    mesh.start_meshpilot(mesh_config=mesh_config)
    plain = mesh.sidecar("plain-1", "127.0.93.11", labels={"app": "plain"}, service_account="plain")
    override = mesh.sidecar("override-1", "127.0.93.12", labels={"app": "override"}, service_account="o")

    for envoy, ip, mode in [(plain, "127.0.93.11", mesh_mode), (override, "127.0.93.12", other)]:
        # A known host works either way.
        assert call(ip, "reviews") == (200, "reviews-v1")
        # An unknown host, and a known one outside the Sidecar's "./*".
        for host in ("unknown.example.com", BILLING):
            before = passthrough_requests(envoy)
            status, body = call(ip, host)
            if mode == "REGISTRY_ONLY":
                # The block_all virtual host answers 502 itself; nothing is sent anywhere.
                assert route_vhosts(envoy, "9080") == {f"{REVIEWS}:9080", "block_all"}
                assert (status, body) == (502, "")
                assert passthrough_requests(envoy) == before
            else:
                assert route_vhosts(envoy, "9080") == {f"{REVIEWS}:9080", "allow_any"}
                # Passed through: the PassthroughCluster took the request (it has no
                # original destination on a bound listener, so Envoy answers 503).
                assert status == 503
                assert passthrough_requests(envoy) == before + 1
        assert envoy.rejected_updates() == {}


class _UnixHttpServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True


@pytest.fixture
def unix_backend(tmp_path: Path) -> Iterator[Path]:
    """An HTTP server on a unix socket that names itself ``unix-app``."""
    path = tmp_path / "app.sock"

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            body = json.dumps({"name": "unix-app", "path": self.path}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def address_string(self) -> str:
            return "unix"

        def log_message(self, *args: Any) -> None:
            pass

    server = _UnixHttpServer(str(path), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_ingress_listeners_forward_to_their_default_endpoints(mesh, unix_backend):
    server_ip = "127.0.93.31"
    loopback_port, pod_ip_port = free_port(), free_port(server_ip)
    # Without a bind the listener takes the wildcard address (a loopback pod IP is
    # not a global unicast one), so its port must be free on every address.
    wildcard_port = free_port("0.0.0.0")
    mesh.write(
        "apps.yaml",
        [
            *workload("app", "default", "10.96.0.30", 9080, {"app-1": server_ip}),
            istio(
                "Sidecar",
                "app",
                "default",
                {
                    "workloadSelector": {"labels": {"app": "app"}},
                    "ingress": [
                        {
                            "port": {"number": 9080, "protocol": "HTTP", "name": "http"},
                            "bind": server_ip,
                            "defaultEndpoint": f"127.0.0.1:{loopback_port}",
                        },
                        {
                            # No bind: the proxy's address; 0.0.0.0 means the pod IP.
                            "port": {"number": wildcard_port, "protocol": "HTTP", "name": "http-pod"},
                            "defaultEndpoint": f"0.0.0.0:{pod_ip_port}",
                        },
                        {
                            "port": {"number": 9082, "protocol": "HTTP", "name": "http-unix"},
                            "bind": server_ip,
                            "defaultEndpoint": f"unix://{unix_backend}",
                        },
                    ],
                    "egress": [{"bind": "127.0.94.31", "hosts": ["./*"]}],
                },
            ),
        ],
    )
    mesh.backend("on-loopback", "127.0.0.1", loopback_port)
    mesh.backend("on-pod-ip", server_ip, pod_ip_port)
    mesh.start_meshpilot()
    server = mesh.sidecar(
        "app-1",
        server_ip,
        labels={"app": "app"},
        service_account="app",
        extra_metadata={"INSTANCE_IPS": server_ip},
    )
    eventually(lambda: call(server_ip, "app", 9080) == (200, "on-loopback"), what="ingress 9080 to the app")
    assert call(server_ip, "app", wildcard_port) == (200, "on-pod-ip")
    assert call(server_ip, "app", 9082) == (200, "unix-app")
    dump = server.config_dump()
    listeners = {
        item["name"]
        for config in dump["configs"]
        if config["@type"].endswith("ListenersConfigDump")
        for item in config.get("dynamic_listeners", [])
    }
    assert {f"{server_ip}_9080", f"0.0.0.0_{wildcard_port}", f"{server_ip}_9082"} <= listeners
    assert {"inbound|9080||", f"inbound|{wildcard_port}||", "inbound|9082||"} <= server.dynamic_clusters()
    assert server.rejected_updates() == {}


def test_virtual_service_exported_to_its_own_namespace_only(mesh):
    mesh.write("apps.yaml", services())
    mesh.write(
        "clients.yaml",
        [
            pod("here-1", "payments", "127.0.93.11", {"app": "here"}),
            client_sidecar("here", "payments", "127.0.93.11", ["payments/*"]),
            pod("away-1", "default", "127.0.93.12", {"app": "away"}),
            client_sidecar("away", "default", "127.0.93.12", ["payments/*"]),
        ],
    )
    start_backends(mesh)
    mesh.start_meshpilot()
    here = mesh.sidecar(
        "here-1", "127.0.93.11", namespace="payments", labels={"app": "here"}, service_account="h"
    )
    away = mesh.sidecar("away-1", "127.0.93.12", labels={"app": "away"}, service_account="a")
    assert call("127.0.93.11", BILLING) == (200, "billing-v1")
    # billing's owners send its traffic to ledger, but only for their own namespace.
    mesh.write(
        "billing-vs.yaml",
        [
            istio(
                "VirtualService",
                "billing",
                "payments",
                {
                    "hosts": ["billing"],
                    "exportTo": ["."],
                    "http": [{"route": [{"destination": {"host": "ledger"}}]}],
                },
            )
        ],
    )
    eventually(lambda: call("127.0.93.11", BILLING) == (200, "ledger-v1"), what="the VirtualService applies")
    assert spread("127.0.93.12", BILLING) == Counter({"billing-v1": 20}), "another namespace is unaffected"
    assert here.rejected_updates() == {} and away.rejected_updates() == {}


def test_destination_rule_with_workload_selector_applies_to_selected_clients_only(mesh):
    mesh.write(
        "apps.yaml",
        [
            *workload(
                "reviews",
                "default",
                "10.96.0.20",
                9080,
                {"reviews-v1": "127.0.93.21", "reviews-v2": "127.0.93.22"},
                versions={"reviews-v1": "v1", "reviews-v2": "v2"},
            ),
            pod("chosen-1", "default", "127.0.93.11", {"app": "chosen"}),
            client_sidecar("chosen", "default", "127.0.93.11", ["./*"]),
            pod("other-1", "default", "127.0.93.12", {"app": "other"}),
            client_sidecar("other", "default", "127.0.93.12", ["./*"]),
            istio(
                "VirtualService",
                "reviews",
                "default",
                {
                    "hosts": ["reviews"],
                    "http": [{"route": [{"destination": {"host": "reviews", "subset": "pinned"}}]}],
                },
            ),
            # For everyone: "pinned" is v1.
            istio(
                "DestinationRule",
                "reviews",
                "default",
                {"host": "reviews", "subsets": [{"name": "pinned", "labels": {"version": "v1"}}]},
            ),
            # For the chosen client only: "pinned" is v2.
            istio(
                "DestinationRule",
                "reviews-chosen",
                "default",
                {
                    "host": "reviews",
                    "workloadSelector": {"matchLabels": {"app": "chosen"}},
                    "subsets": [{"name": "pinned", "labels": {"version": "v2"}}],
                },
            ),
        ],
    )
    mesh.backend("reviews-v1", "127.0.93.21", 9080)
    mesh.backend("reviews-v2", "127.0.93.22", 9080)
    mesh.start_meshpilot()
    chosen = mesh.sidecar("chosen-1", "127.0.93.11", labels={"app": "chosen"}, service_account="c")
    other = mesh.sidecar("other-1", "127.0.93.12", labels={"app": "other"}, service_account="o")
    pinned = f"outbound|9080|pinned|{REVIEWS}"
    eventually(lambda: chosen.endpoints(pinned) == ["127.0.93.22:9080"], what="chosen client's subset")
    eventually(lambda: other.endpoints(pinned) == ["127.0.93.21:9080"], what="other client's subset")
    assert spread("127.0.93.11", "reviews") == Counter({"reviews-v2": 20})
    assert spread("127.0.93.12", "reviews") == Counter({"reviews-v1": 20})
    assert chosen.rejected_updates() == {} and other.rejected_updates() == {}


def test_egress_proxy_proxy_protocol_and_inbound_pool_reach_envoy(mesh):
    """Sidecar egressProxy takes unknown HTTP traffic to its service; a DestinationRule's proxyProtocol
    and a Sidecar's inboundConnectionPool are accepted by Envoy as generated."""
    mesh.write("apps.yaml", services())
    mesh.write(
        "clients.yaml",
        [
            pod("plain-1", "default", "127.0.93.11", {"app": "plain"}),
            client_sidecar(
                "plain",
                "default",
                "127.0.93.11",
                ["./*", "tools/*", "payments/*"],
                outboundTrafficPolicy={
                    "mode": "ALLOW_ANY",
                    "egressProxy": {"host": SEARCH, "port": {"number": 9080}},
                },
                inboundConnectionPool={"tcp": {"maxConnections": 7}},
            ),
            istio(
                "DestinationRule",
                "ledger",
                "payments",
                {"host": LEDGER, "trafficPolicy": {"proxyProtocol": {"version": "V2"}}},
            ),
        ],
    )
    start_backends(mesh)
    mesh.start_meshpilot()
    envoy = mesh.sidecar("plain-1", "127.0.93.11", labels={"app": "plain"}, service_account="plain")
    eventually(
        lambda: f"outbound|9080||{SEARCH}" in outbound_clusters(envoy), what="the egress proxy cluster"
    )
    before = passthrough_requests(envoy)
    assert call("127.0.93.11", "unknown.example.com") == (200, "search-v1"), (
        "unknown hosts go to the egress proxy"
    )
    assert passthrough_requests(envoy) == before
    assert call("127.0.93.11", "reviews") == (200, "reviews-v1"), "known hosts are routed as before"
    clusters = {
        item["cluster"]["name"]: item["cluster"]
        for config in envoy.config_dump()["configs"]
        if config["@type"].endswith("ClustersConfigDump")
        for item in config.get("dynamic_active_clusters", [])
    }
    ledger = clusters[f"outbound|9080||{LEDGER}"]
    # Every transport socket of the cluster (the mTLS and plaintext matches) is wrapped.
    sockets = [m["transport_socket"]["name"] for m in ledger.get("transport_socket_matches", [])]
    sockets += [ledger["transport_socket"]["name"]] if "transport_socket" in ledger else []
    assert sockets and set(sockets) == {"envoy.transport_sockets.upstream_proxy_protocol"}, sockets
    assert envoy.rejected_updates() == {}
