"""VirtualService tcp and tls routes through a real Envoy sidecar (INTERCEPTION_MODE NONE) on loopback."""

from __future__ import annotations

import json
import ssl
from collections import Counter
from typing import Any

import pytest
from support.backends import tcp_hello
from support.kube import istio, namespace, workload
from support.processes import free_port
from support.tls_backend import tls_hello
from support.wait import eventually

pytestmark = [pytest.mark.envoy, pytest.mark.integration]

CLIENT_IP = "127.0.0.11"
#: A second address the client's Sidecar binds for the echo port only (destinationSubnets).
SECOND_BIND = "127.0.0.12"
ECHO_PORT = 7000
TLS_PORT = 8443
V1 = "outbound|7000|v1|echo.default.svc.cluster.local"
V2 = "outbound|7000|v2|echo.default.svc.cluster.local"


def sidecar(egress: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return istio(
        "Sidecar",
        "client",
        "default",
        {"workloadSelector": {"labels": {"app": "client"}}, "egress": egress, **spec},
    )


def base_config(mesh, egress: list[dict[str, Any]] | None = None, **sidecar_spec: Any) -> None:
    mesh.write("namespace.yaml", [namespace("default")])
    mesh.write("client.yaml", workload("client", "default", "10.96.0.10", 9080, {"client-0": CLIENT_IP}))
    mesh.write(
        "echo.yaml",
        workload(
            "echo",
            "default",
            "10.96.0.20",
            ECHO_PORT,
            {"echo-v1": "127.0.0.21", "echo-v2": "127.0.0.22"},
            port_name="tcp",
            versions={"echo-v1": "v1", "echo-v2": "v2"},
        ),
    )
    mesh.write(
        "echo-rule.yaml",
        [
            istio(
                "DestinationRule",
                "echo",
                "default",
                {
                    "host": "echo",
                    "subsets": [
                        {"name": "v1", "labels": {"version": "v1"}},
                        {"name": "v2", "labels": {"version": "v2"}},
                    ],
                },
            )
        ],
    )
    mesh.write("sidecar.yaml", [sidecar(egress or [{"bind": CLIENT_IP, "hosts": ["./*"]}], **sidecar_spec)])


def start(mesh) -> Any:
    mesh.tcp_backend("echo-v1", "127.0.0.21", ECHO_PORT)
    mesh.tcp_backend("echo-v2", "127.0.0.22", ECHO_PORT)
    mesh.start_meshpilot()
    return mesh.sidecar("client-0", CLIENT_IP, labels={"app": "client"}, service_account="client")


def spread(n: int, host: str = CLIENT_IP) -> Counter[str]:
    return Counter(tcp_hello(host, ECHO_PORT) for _ in range(n))


def echo_route(*routes: dict[str, Any], match: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    rule: dict[str, Any] = {"route": list(routes)}
    if match is not None:
        rule["match"] = match
    return rule


def write_vs(mesh, tcp: list[dict[str, Any]]) -> None:
    mesh.write("echo-vs.yaml", [istio("VirtualService", "echo", "default", {"hosts": ["echo"], "tcp": tcp})])


def tcp_proxies(envoy, listener: str) -> list[dict[str, Any]]:
    """The tcp_proxy configs of one active listener, as Envoy holds them."""
    for config in envoy.config_dump()["configs"]:
        if not config["@type"].endswith("ListenersConfigDump"):
            continue
        for entry in config.get("dynamic_listeners", []):
            if entry["name"] != listener or "active_state" not in entry:
                continue
            found = entry["active_state"]["listener"]
            chains = [*found.get("filter_chains", []), found.get("default_filter_chain", {})]
            return [
                f["typed_config"] for c in chains for f in c.get("filters", []) if "tcp_proxy" in f["name"]
            ]
    return []


def test_tcp_route_weights_split_connections(mesh) -> None:
    base_config(mesh)
    client = start(mesh)
    eventually(lambda: set(spread(20)) == {"echo-v1", "echo-v2"}, timeout=15, what="both versions by default")

    write_vs(
        mesh,
        [
            echo_route(
                {"destination": {"host": "echo", "subset": "v1"}, "weight": 80},
                {"destination": {"host": "echo", "subset": "v2"}, "weight": 20},
            )
        ],
    )
    listener = f"{CLIENT_IP}_{ECHO_PORT}"
    eventually(
        lambda: any("weighted_clusters" in p for p in tcp_proxies(client, listener)),
        timeout=10,
        what="weighted tcp_proxy in Envoy",
    )
    [proxy] = tcp_proxies(client, listener)
    weights = {c["name"]: c["weight"] for c in proxy["weighted_clusters"]["clusters"]}
    assert weights == {V1: 80, V2: 20}
    n = 300
    counts = spread(n)
    assert set(counts) == {"echo-v1", "echo-v2"}, counts
    # Binomial(300, 0.8): the mean is 240 and one standard deviation about 7; 30 is over 4.
    assert abs(counts["echo-v1"] - 0.8 * n) <= 30, counts

    write_vs(mesh, [echo_route({"destination": {"host": "echo", "subset": "v2"}})])
    eventually(lambda: spread(20) == Counter({"echo-v2": 20}), timeout=10, what="all connections on v2")
    assert spread(40) == Counter({"echo-v2": 40})
    assert client.rejected_updates() == {}


def test_tcp_matches_on_destination_subnet_and_source(mesh) -> None:
    # The echo port is also bound on a second address, so destinationSubnets can tell the two apart.
    egress = [
        {
            "port": {"number": ECHO_PORT, "protocol": "TCP", "name": "tcp"},
            "bind": SECOND_BIND,
            "hosts": ["./*"],
        },
        {"bind": CLIENT_IP, "hosts": ["./*"]},
    ]
    base_config(mesh, egress)
    write_vs(
        mesh,
        [
            echo_route(
                {"destination": {"host": "echo", "subset": "v2"}},
                match=[{"destinationSubnets": [f"{SECOND_BIND}/32"]}],
            ),
            # Another workload's rule: never for this client.
            echo_route(
                {"destination": {"host": "echo", "subset": "v2"}},
                match=[{"sourceLabels": {"app": "someone-else"}}],
            ),
            echo_route(
                {"destination": {"host": "echo", "subset": "v1"}},
                match=[{"sourceLabels": {"app": "client"}, "sourceNamespace": "default"}],
            ),
        ],
    )
    client = start(mesh)
    eventually(lambda: spread(10, SECOND_BIND) == Counter({"echo-v2": 10}), timeout=15, what="subnet route")
    assert spread(30) == Counter({"echo-v1": 30})
    assert spread(30, SECOND_BIND) == Counter({"echo-v2": 30})
    assert client.rejected_updates() == {}


def tls_config(mesh) -> None:
    base_config(mesh, outboundTrafficPolicy={"mode": "REGISTRY_ONLY"})
    for name, ip, port in (("tls-a", "127.0.0.41", 9441), ("tls-b", "127.0.0.42", 9442)):
        mesh.write(
            f"{name}.yaml",
            workload(
                name, "default", ip.replace("127.0.0", "10.96.1"), port, {f"{name}-0": ip}, port_name="tls"
            ),
        )
    mesh.write(
        "wildcard.yaml",
        [
            istio(
                "ServiceEntry",
                "tls-example",
                "default",
                {
                    "hosts": ["*.tls.example"],
                    "location": "MESH_EXTERNAL",
                    "resolution": "NONE",
                    "ports": [{"number": TLS_PORT, "name": "tls", "protocol": "TLS"}],
                },
            ),
            istio(
                "VirtualService",
                "tls-example",
                "default",
                {
                    "hosts": ["*.tls.example"],
                    "tls": [
                        {
                            "match": [{"sniHosts": ["a.tls.example"], "port": TLS_PORT}],
                            "route": [{"destination": {"host": "tls-a"}}],
                        },
                        {
                            "match": [{"sniHosts": ["b.tls.example", "also-b.tls.example"]}],
                            "route": [{"destination": {"host": "tls-b", "port": {"number": 9442}}}],
                        },
                    ],
                },
            ),
        ],
    )


def test_tls_route_by_sni(mesh) -> None:
    tls_config(mesh)
    a = mesh.tls_backend("tls-a", "127.0.0.41", 9441, ["a.tls.example"])
    b = mesh.tls_backend("tls-b", "127.0.0.42", 9442, ["b.tls.example", "also-b.tls.example"])
    mesh.start_meshpilot()
    client = mesh.sidecar("client-0", CLIENT_IP, labels={"app": "client"}, service_account="client")

    def hello(sni: str, cafile: Any = None) -> str:
        return tls_hello(CLIENT_IP, TLS_PORT, sni, cafile=cafile)

    # Envoy does not terminate TLS: the client verifies the backend's own certificate for the name.
    eventually(lambda: hello("a.tls.example", a.cert) == "tls-a a.tls.example", timeout=15, what="SNI a")
    assert hello("b.tls.example", b.cert) == "tls-b b.tls.example"
    assert hello("also-b.tls.example", b.cert) == "tls-b also-b.tls.example"
    for _ in range(5):
        assert hello("a.tls.example") == "tls-a a.tls.example"
        assert hello("b.tls.example") == "tls-b b.tls.example"
    # An SNI no route names falls to the default chain; REGISTRY_ONLY makes that the black hole.
    with pytest.raises((ssl.SSLError, OSError)):
        hello("c.tls.example")
    assert set(a.server_names) == {"a.tls.example"}
    assert set(b.server_names) == {"b.tls.example", "also-b.tls.example"}

    dump = json.dumps(client.config_dump())
    assert "envoy.filters.listener.tls_inspector" in dump
    assert client.rejected_updates() == {}


def test_capture_mode_chains_for_ranges_and_subnets_are_accepted(mesh, tmp_path) -> None:
    """CIDR ServiceEntries and subnet matches listen on the wildcard with prefix ranges (REDIRECT mode)."""
    outbound, inbound = free_port(), free_port()
    mesh_config = tmp_path / "mesh.yaml"
    mesh_config.write_text(f"proxyListenPort: {outbound}\nproxyInboundListenPort: {inbound}\n")
    base_config(mesh, egress=[{"hosts": ["./*"]}])

    def ranged(name: str, addresses: list[str]) -> dict[str, Any]:
        spec = {
            "hosts": [f"{name}.ranges.example"],
            "addresses": addresses,
            "location": "MESH_EXTERNAL",
            "resolution": "NONE",
            "ports": [{"number": 7700, "name": "tcp", "protocol": "TCP"}],
        }
        return istio("ServiceEntry", name, "default", spec)

    mesh.write(
        "ranges.yaml",
        [
            ranged("first", ["10.20.0.0/16"]),
            ranged("second", ["10.30.0.0/16", "10.40.0.7/32"]),
            istio(
                "VirtualService",
                "first",
                "default",
                {
                    "hosts": ["first.ranges.example"],
                    "tcp": [
                        {
                            # 10.20.9.0/24 lies inside the entry's range: a more specific chain.
                            "match": [{"destinationSubnets": ["10.20.9.0/24"]}],
                            "route": [
                                {"destination": {"host": "echo", "subset": "v1", "port": {"number": 7000}}}
                            ],
                        }
                    ],
                },
            ),
        ],
    )
    write_vs(
        mesh,
        [
            echo_route(
                {"destination": {"host": "echo", "subset": "v1"}},
                match=[{"destinationSubnets": ["10.96.0.0/16"]}],
            ),
        ],
    )
    mesh.start_meshpilot(mesh_config=mesh_config)
    client = mesh.sidecar(
        "client-0", CLIENT_IP, labels={"app": "client"}, service_account="client", interception="REDIRECT"
    )

    def matches(listener: str) -> list[Any]:
        for config in client.config_dump()["configs"]:
            if config["@type"].endswith("ListenersConfigDump"):
                for entry in config.get("dynamic_listeners", []):
                    if entry["name"] == listener and "active_state" in entry:
                        found = entry["active_state"]["listener"]
                        return [c.get("filter_chain_match", {}) for c in found.get("filter_chains", [])]
        return []

    ranges = eventually(lambda: matches("0.0.0.0_7700"), timeout=15, what="the wildcard listener for ranges")
    prefixes = [
        [f"{r['address_prefix']}/{r['prefix_len']}" for r in m.get("prefix_ranges", [])] for m in ranges
    ]
    assert sorted(prefixes) == [["10.20.0.0/16"], ["10.20.9.0/24"], ["10.30.0.0/16"]]
    # A /32 is an address: a listener of its own.
    assert eventually(lambda: matches("10.40.0.7_7700") == [{}], what="the /32 listener")
    echo = matches("10.96.0.20_7000")
    assert [m.get("prefix_ranges") for m in echo] == [[{"address_prefix": "10.96.0.0", "prefix_len": 16}]]
    assert client.rejected_updates() == {}


def test_headless_tcp_listeners_follow_endpoints(mesh, tmp_path) -> None:
    """A headless TCP service listens per endpoint address; a new endpoint adds a listener (full push)."""
    outbound, inbound = free_port(), free_port()
    mesh_config = tmp_path / "mesh.yaml"
    mesh_config.write_text(f"proxyListenPort: {outbound}\nproxyInboundListenPort: {inbound}\n")
    base_config(mesh, egress=[{"hosts": ["./*"]}])

    def db(instances: dict[str, str]) -> list[dict[str, Any]]:
        docs = workload("db", "default", "None", 5432, instances, port_name="tcp")
        docs[0]["spec"]["clusterIP"] = "None"
        return docs

    mesh.write("db.yaml", db({"db-0": "127.0.0.31"}))
    mesh.start_meshpilot(mesh_config=mesh_config)
    client = mesh.sidecar(
        "client-0", CLIENT_IP, labels={"app": "client"}, service_account="client", interception="REDIRECT"
    )

    def listeners() -> set[str]:
        for config in client.config_dump()["configs"]:
            if config["@type"].endswith("ListenersConfigDump"):
                return {e["name"] for e in config.get("dynamic_listeners", []) if "active_state" in e}
        return set()

    eventually(lambda: "127.0.0.31_5432" in listeners(), timeout=15, what="listener of the first endpoint")
    mesh.write("db.yaml", db({"db-0": "127.0.0.31", "db-1": "127.0.0.32"}))
    eventually(lambda: "127.0.0.32_5432" in listeners(), timeout=10, what="listener of the new endpoint")
    assert "0.0.0.0_5432" not in listeners()
    assert client.rejected_updates() == {}
