"""ServiceEntries through a real Envoy sidecar (INTERCEPTION_MODE NONE) on loopback."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from support.backends import tcp_hello
from support.kube import egress_sidecar, istio, namespace, pod, workload
from support.wait import eventually

pytestmark = [pytest.mark.envoy, pytest.mark.integration]

CLIENT_IP = "127.0.0.11"


def entry(
    name: str, port: int, resolution: str, location: str = "MESH_INTERNAL", **spec: Any
) -> dict[str, Any]:
    body = {
        "hosts": [f"{name}.mesh.example"],
        "location": location,
        "resolution": resolution,
        "ports": [{"number": port, "name": "tcp", "protocol": "TCP"}],
        **spec,
    }
    return istio("ServiceEntry", name, "default", body)


def base_config(mesh) -> None:
    mesh.write("namespace.yaml", [namespace("default")])
    mesh.write("client.yaml", workload("client", "default", "10.96.0.10", 9080, {"client-0": CLIENT_IP}))
    mesh.write(
        "sidecar.yaml",
        [egress_sidecar("client", CLIENT_IP)],
    )


def start_client(mesh) -> Any:
    mesh.start_meshpilot()
    return mesh.sidecar("client-0", CLIENT_IP, labels={"app": "client"}, service_account="client")


def spread(port: int, n: int = 30) -> Counter[str]:
    return Counter(tcp_hello(CLIENT_IP, port) for _ in range(n))


def cluster_dump(envoy, name: str) -> dict[str, Any]:
    for config in envoy.config_dump()["configs"]:
        if config["@type"].endswith("ClustersConfigDump"):
            for entry in config.get("dynamic_active_clusters", []):
                if entry["cluster"]["name"] == name:
                    return dict(entry["cluster"])
    raise AssertionError(f"no cluster {name}")


def test_static_entry_with_inline_endpoints(mesh) -> None:
    base_config(mesh)
    mesh.write(
        "static.yaml",
        [entry("static", 7100, "STATIC", endpoints=[{"address": "127.0.0.51"}, {"address": "127.0.0.52"}])],
    )
    mesh.tcp_backend("static-1", "127.0.0.51", 7100)
    mesh.tcp_backend("static-2", "127.0.0.52", 7100)
    client = start_client(mesh)
    eventually(lambda: set(spread(7100)) == {"static-1", "static-2"}, timeout=15, what="both endpoints")
    assert cluster_dump(client, "outbound|7100||static.mesh.example")["type"] == "EDS"
    assert client.rejected_updates() == {}


def test_dns_entries_resolve_names_and_literals(mesh) -> None:
    base_config(mesh)
    mesh.write(
        "dns.yaml",
        [
            # A name the machine resolves (to 127.0.0.1): Envoy looks it up itself (STRICT_DNS).
            entry("byname", 7201, "DNS", endpoints=[{"address": "localhost"}]),
            # An IP literal, with the workload's own port for the service port.
            entry("literal", 7202, "DNS", endpoints=[{"address": "127.0.0.53", "ports": {"tcp": 7212}}]),
            # One endpoint at a time (LOGICAL_DNS).
            entry("roundrobin", 7203, "DNS_ROUND_ROBIN", endpoints=[{"address": "127.0.0.54"}]),
        ],
    )
    mesh.tcp_backend("localhost-backend", "127.0.0.1", 7201)
    mesh.tcp_backend("literal-backend", "127.0.0.53", 7212)
    mesh.tcp_backend("roundrobin-backend", "127.0.0.54", 7203)
    client = start_client(mesh)
    eventually(lambda: spread(7201, 3) == Counter({"localhost-backend": 3}), timeout=15, what="by name")
    assert spread(7202, 5) == Counter({"literal-backend": 5})
    assert spread(7203, 5) == Counter({"roundrobin-backend": 5})
    assert cluster_dump(client, "outbound|7201||byname.mesh.example")["type"] == "STRICT_DNS"
    assert cluster_dump(client, "outbound|7203||roundrobin.mesh.example")["type"] == "LOGICAL_DNS"
    assert client.rejected_updates() == {}


def test_workload_selector_picks_workload_entries_and_pods(mesh) -> None:
    base_config(mesh)
    selected = entry("selected", 7400, "STATIC", workloadSelector={"labels": {"app": "legacy"}})
    vm_1 = istio("WorkloadEntry", "vm-1", "default", {"address": "127.0.0.61", "labels": {"app": "legacy"}})
    vm_2 = istio(
        "WorkloadEntry",
        "vm-2",
        "default",
        {"address": "127.0.0.62", "labels": {"app": "legacy"}, "ports": {"tcp": 7402}},
    )
    other = istio("WorkloadEntry", "other", "default", {"address": "127.0.0.64", "labels": {"app": "other"}})
    mesh.write("selected.yaml", [selected, vm_1, vm_2, other])
    mesh.write("legacy-pod.yaml", [pod("legacy-pod", "default", "127.0.0.63", {"app": "legacy"})])
    for name, ip, port in (
        ("vm-1", "127.0.0.61", 7400),
        ("vm-2", "127.0.0.62", 7402),
        ("legacy-pod", "127.0.0.63", 7400),
        ("other", "127.0.0.64", 7400),
    ):
        mesh.tcp_backend(name, ip, port)
    client = start_client(mesh)
    eventually(
        lambda: set(spread(7400, 40)) == {"vm-1", "vm-2", "legacy-pod"},
        timeout=15,
        what="two WorkloadEntries and a Pod",
    )
    # The selection follows the workloads: a WorkloadEntry that is gone gets no more traffic.
    mesh.write("selected.yaml", [selected, vm_2, other])
    eventually(lambda: set(spread(7400, 30)) == {"vm-2", "legacy-pod"}, timeout=10, what="vm-1 removed")
    mesh.remove("legacy-pod.yaml")
    eventually(lambda: spread(7400, 10) == Counter({"vm-2": 10}), timeout=10, what="pod removed")
    assert client.rejected_updates() == {}


def test_mesh_external_clusters_have_no_istio_mtls_match(mesh) -> None:
    base_config(mesh)
    endpoints = [{"address": "127.0.0.71", "serviceAccount": "backend"}]
    mesh.write(
        "locations.yaml",
        [
            entry("outside", 7501, "STATIC", "MESH_EXTERNAL", endpoints=endpoints),
            entry("inside", 7502, "STATIC", "MESH_INTERNAL", endpoints=endpoints),
        ],
    )
    mesh.tcp_backend("outside-backend", "127.0.0.71", 7501)
    client = start_client(mesh)
    outside = eventually(lambda: cluster_dump(client, "outbound|7501||outside.mesh.example"), what="outside")
    inside = eventually(lambda: cluster_dump(client, "outbound|7502||inside.mesh.example"), what="inside")
    assert "transport_socket_matches" not in outside and "transport_socket" not in outside
    assert outside["metadata"]["filter_metadata"]["istio"]["external"] is True
    assert [m["name"] for m in inside["transport_socket_matches"]] == ["tlsMode-istio", "tlsMode-disabled"]
    # The endpoint has an identity, yet mesh-external traffic stays plaintext and arrives.
    eventually(lambda: spread(7501, 3) == Counter({"outside-backend": 3}), timeout=10, what="plaintext")
    assert client.rejected_updates() == {}


def test_dns_entry_follows_the_workload_entries_it_selects(mesh) -> None:
    """A DNS entry's endpoints are in its cluster (CDS), so a change must reach Envoy by a config push."""
    base_config(mesh)
    selected = entry("dnsselect", 7600, "DNS", workloadSelector={"labels": {"app": "dns-vm"}})

    def vm(name: str, ip: str) -> dict[str, Any]:
        return istio("WorkloadEntry", name, "default", {"address": ip, "labels": {"app": "dns-vm"}})

    mesh.write("dnsselect.yaml", [selected])
    mesh.write("dns-vm.yaml", [vm("dns-vm-1", "127.0.0.81")])
    mesh.tcp_backend("dns-vm-1", "127.0.0.81", 7600)
    mesh.tcp_backend("dns-vm-2", "127.0.0.82", 7600)
    client = start_client(mesh)
    eventually(lambda: spread(7600, 5) == Counter({"dns-vm-1": 5}), timeout=15, what="first workload")
    # The same WorkloadEntry moves: one update, the endpoint set never empty.
    mesh.write("dns-vm.yaml", [vm("dns-vm-1", "127.0.0.82")])
    eventually(lambda: spread(7600, 5) == Counter({"dns-vm-2": 5}), timeout=10, what="moved workload")
    assert cluster_dump(client, "outbound|7600||dnsselect.mesh.example")["type"] == "STRICT_DNS"
    assert client.rejected_updates() == {}
