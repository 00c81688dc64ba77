"""ServiceEntries and the WorkloadEntries they select, as services and endpoints."""

from __future__ import annotations

from typing import Any

from support.kube import istio
from support.kube import pod as kube_pod
from support.updater import Updater

from meshpilot.config.decode import decode_object
from meshpilot.config.store import ConfigStore
from meshpilot.model.config import Config, ConfigKey
from meshpilot.model.kind import Kind
from meshpilot.model.protocol import Protocol
from meshpilot.model.service import Registry, Resolution
from meshpilot.registry.kube.controller import KubeRegistry
from meshpilot.registry.serviceentry.controller import ServiceEntryRegistry


def add(store: ConfigStore, doc: dict[str, Any]) -> None:
    obj = decode_object(doc).obj
    assert isinstance(obj, Config)
    store.upsert(obj)


def test_static_service_entry_with_inline_endpoints() -> None:
    store, updater = ConfigStore(), Updater()
    registry = ServiceEntryRegistry(store, updater)
    add(
        store,
        istio(
            "ServiceEntry",
            "db",
            "default",
            {
                "hosts": ["db.example.com", "db2.example.com"],
                "addresses": ["240.0.0.1/32"],
                "location": "MESH_INTERNAL",
                "ports": [{"number": 5432, "name": "http-api", "protocol": "HTTP"}],
                "resolution": "STATIC",
                "endpoints": [
                    {"address": "10.2.0.1", "labels": {"v": "1"}, "serviceAccount": "db"},
                    {"address": "10.2.0.2", "ports": {"http-api": 6432}},
                ],
            },
        ),
    )
    services = {s.hostname: s for s in registry.services()}
    assert set(services) == {"db.example.com", "db2.example.com"}
    svc = services["db.example.com"]
    assert svc.registry is Registry.EXTERNAL and svc.resolution is Resolution.CLIENT_SIDE_LB
    assert svc.default_address == "240.0.0.1", "a /32 is written as its address"
    assert svc.ports[0].protocol is Protocol.HTTP
    assert not svc.mesh_external
    endpoints = updater.endpoints["db.example.com"]
    assert [(e.address, e.port, e.tls_mode) for e in endpoints] == [
        ("10.2.0.1", 5432, "istio"),
        ("10.2.0.2", 6432, "disabled"),
    ]
    assert endpoints[0].service_account == "spiffe://cluster.local/ns/default/sa/db"


def test_dns_service_entry_without_endpoints_resolves_its_host() -> None:
    store, updater = ConfigStore(), Updater()
    registry = ServiceEntryRegistry(store, updater)
    add(
        store,
        istio(
            "ServiceEntry",
            "google",
            "default",
            {
                "hosts": ["www.google.com"],
                "ports": [{"number": 443, "name": "https", "protocol": "HTTPS"}],
                "resolution": "DNS",
                "location": "MESH_EXTERNAL",
            },
        ),
    )
    [svc] = registry.services()
    assert svc.resolution is Resolution.DNS_LB and svc.mesh_external
    assert [(e.address, e.port) for e in updater.endpoints["www.google.com"]] == [("www.google.com", 443)]


def test_workload_entries_follow_the_selector() -> None:
    store, updater = ConfigStore(), Updater()
    ServiceEntryRegistry(store, updater)
    add(
        store,
        istio(
            "ServiceEntry",
            "vm",
            "default",
            {
                "hosts": ["vm.default.svc.cluster.local"],
                "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
                "resolution": "STATIC",
                "workloadSelector": {"labels": {"app": "vm"}},
            },
        ),
    )
    assert updater.endpoints["vm.default.svc.cluster.local"] == []
    add(store, istio("WorkloadEntry", "vm-1", "default", {"address": "10.3.0.1", "labels": {"app": "vm"}}))
    add(store, istio("WorkloadEntry", "other", "default", {"address": "10.3.0.2", "labels": {"app": "x"}}))
    assert [e.address for e in updater.endpoints["vm.default.svc.cluster.local"]] == ["10.3.0.1"]
    store.delete(ConfigKey(Kind.WORKLOAD_ENTRY, "vm-1", "default"))
    assert updater.endpoints["vm.default.svc.cluster.local"] == []
    store.delete(ConfigKey(Kind.SERVICE_ENTRY, "vm", "default"))
    assert updater.services[-1] == ("vm.default.svc.cluster.local", True)


def _selecting_entry(resolution: str = "STATIC") -> dict[str, Any]:
    return istio(
        "ServiceEntry",
        "vm",
        "default",
        {
            "hosts": ["vm.example.com"],
            "location": "MESH_INTERNAL",
            "ports": [{"number": 80, "name": "http", "protocol": "HTTP", "targetPort": 8080}],
            "resolution": resolution,
            "workloadSelector": {"labels": {"app": "vm"}},
        },
    )


def test_the_selector_picks_pods_too_in_either_order() -> None:
    store, updater = ConfigStore(), Updater()
    kube = KubeRegistry(updater)
    ServiceEntryRegistry(store, updater, pods=kube)
    early = kube_pod("early", "default", "10.4.0.1", {"app": "vm"}, service_account="vm")
    early["spec"]["containers"][0]["ports"] = [{"name": "http", "containerPort": 9090}]
    kube.upsert(decode_object(early).obj)
    kube.upsert(decode_object(kube_pod("stranger", "default", "10.4.0.9", {"app": "x"})).obj)
    add(store, _selecting_entry())
    endpoints = updater.endpoints["vm.example.com"]
    # The Pod's named container port wins over the ServiceEntry's targetPort.
    assert [(e.address, e.port, e.service_account) for e in endpoints] == [
        ("10.4.0.1", 9090, "spiffe://cluster.local/ns/default/sa/vm")
    ]
    kube.upsert(decode_object(kube_pod("late", "default", "10.4.0.2", {"app": "vm"})).obj)
    add(store, istio("WorkloadEntry", "we-1", "default", {"address": "10.3.0.1", "labels": {"app": "vm"}}))
    # Pods first, then WorkloadEntries, each by name (istiod's order).
    assert [(e.address, e.port) for e in updater.endpoints["vm.example.com"]] == [
        ("10.4.0.1", 9090),
        ("10.4.0.2", 8080),
        ("10.3.0.1", 8080),
    ]
    kube.remove(Kind.POD, "default", "early")
    assert [e.address for e in updater.endpoints["vm.example.com"]] == ["10.4.0.2", "10.3.0.1"]
    relabelled = kube_pod("late", "default", "10.4.0.2", {"app": "other"})
    kube.upsert(decode_object(relabelled).obj)
    assert [e.address for e in updater.endpoints["vm.example.com"]] == ["10.3.0.1"]


def test_workload_entry_metadata_labels_count_and_win() -> None:
    store, updater = ConfigStore(), Updater()
    ServiceEntryRegistry(store, updater)
    add(store, _selecting_entry())
    entry = istio("WorkloadEntry", "we-1", "default", {"address": "10.3.0.1", "labels": {"app": "nope"}})
    entry["metadata"]["labels"] = {"app": "vm", "version": "v1"}
    add(store, entry)
    [endpoint] = updater.endpoints["vm.example.com"]
    assert endpoint.labels["app"] == "vm" and endpoint.labels["version"] == "v1"


def test_workloads_addressed_by_name_back_only_dns_entries() -> None:
    for resolution, expected in (("STATIC", []), ("DNS", ["vm-1.example.com"])):
        store, updater = ConfigStore(), Updater()
        ServiceEntryRegistry(store, updater)
        add(store, _selecting_entry(resolution))
        add(
            store,
            istio(
                "WorkloadEntry", "vm-1", "default", {"address": "vm-1.example.com", "labels": {"app": "vm"}}
            ),
        )
        assert [e.address for e in updater.endpoints["vm.example.com"]] == expected, resolution


def test_services_are_named_after_their_hosts() -> None:
    store, updater = ConfigStore(), Updater()
    registry = ServiceEntryRegistry(store, updater)
    add(store, _selecting_entry())
    [svc] = registry.services()
    assert (svc.name, svc.namespace) == ("vm.example.com", "default")


def test_endpoint_changes_of_dns_entries_push_config() -> None:
    """A DNS ServiceEntry's endpoints live in its cluster, so EDS alone cannot deliver them."""
    for resolution, full_pushes in (("DNS", 1), ("STATIC", 0)):
        store, updater = ConfigStore(), Updater()
        ServiceEntryRegistry(store, updater)
        add(store, _selecting_entry(resolution))
        add(
            store, istio("WorkloadEntry", "vm-1", "default", {"address": "10.3.0.1", "labels": {"app": "vm"}})
        )
        assert [r.full for r in updater.requests] == [True] * full_pushes, resolution
        if full_pushes:
            [request] = updater.requests
            assert {(k.kind, k.name) for k in request.configs_updated} == {
                (Kind.SERVICE_ENTRY, "vm.example.com")
            }


def test_only_ready_pods_are_selected() -> None:
    store, updater = ConfigStore(), Updater()
    kube = KubeRegistry(updater)
    ServiceEntryRegistry(store, updater, pods=kube)
    add(store, _selecting_entry())

    def with_status(name: str, ip: str, **status: Any) -> Any:
        doc = kube_pod(name, "default", ip, {"app": "vm"})
        doc["status"].update(status)
        return decode_object(doc).obj

    kube.upsert(with_status("ready", "10.4.0.1", conditions=[{"type": "Ready", "status": "True"}]))
    kube.upsert(with_status("starting", "10.4.0.2", conditions=[{"type": "Ready", "status": "False"}]))
    kube.upsert(with_status("pending", "10.4.0.3", phase="Pending"))
    kube.upsert(with_status("no-conditions", "10.4.0.4"))
    assert [e.address for e in updater.endpoints["vm.example.com"]] == ["10.4.0.4", "10.4.0.1"]
    kube.upsert(with_status("starting", "10.4.0.2", conditions=[{"type": "Ready", "status": "True"}]))
    assert [e.address for e in updater.endpoints["vm.example.com"]] == ["10.4.0.4", "10.4.0.1", "10.4.0.2"]


def test_workload_entries_of_a_batch_are_refreshed_once_at_its_end() -> None:
    """A file of many entries computes each selecting host's endpoints once, not once per entry."""
    store, updater = ConfigStore(), Updater()
    ServiceEntryRegistry(store, updater)
    add(store, _selecting_entry())
    calls = updater.eds_calls
    with store.batch():
        for i in range(50):
            add(
                store,
                istio(
                    "WorkloadEntry", f"vm-{i}", "default", {"address": f"10.3.0.{i}", "labels": {"app": "vm"}}
                ),
            )
        assert updater.eds_calls == calls, "nothing is recomputed inside the batch"
        store.delete(ConfigKey(Kind.WORKLOAD_ENTRY, "vm-7", "default"))
    assert updater.eds_calls == calls + 1
    addresses = [e.address for e in updater.endpoints["vm.example.com"]]
    assert addresses == [f"10.3.0.{i}" for i in sorted(set(range(50)) - {7}, key=lambda i: f"vm-{i}")]
    # Outside a batch an entry's change is reported at once.
    store.delete(ConfigKey(Kind.WORKLOAD_ENTRY, "vm-8", "default"))
    assert updater.eds_calls == calls + 2 and len(updater.endpoints["vm.example.com"]) == 48


def test_selected_pods_of_a_batch_are_refreshed_at_its_end() -> None:
    store, updater = ConfigStore(), Updater()
    kube = KubeRegistry(updater)
    ServiceEntryRegistry(store, updater, pods=kube)
    add(store, _selecting_entry())
    calls = updater.eds_calls
    with store.batch():
        for i in range(20):
            kube.upsert(decode_object(kube_pod(f"vm-{i:02}", "default", f"10.4.0.{i}", {"app": "vm"})).obj)
        assert updater.eds_calls == calls
    assert updater.eds_calls == calls + 1
    assert [e.address for e in updater.endpoints["vm.example.com"]] == [f"10.4.0.{i}" for i in range(20)]


def test_a_workload_event_keeps_the_unchanged_service_object() -> None:
    # Snapshots tell unchanged services by identity (shared outputs, kept listener keys).
    store, updater = ConfigStore(), Updater()
    kube = KubeRegistry(updater)
    registry = ServiceEntryRegistry(store, updater, pods=kube)
    add(store, _selecting_entry())
    before = registry.services()
    kube.upsert(decode_object(kube_pod("vm-0", "default", "10.4.0.1", {"app": "vm"})).obj)
    assert [e.address for e in updater.endpoints["vm.example.com"]] == ["10.4.0.1"]
    assert [id(s) for s in registry.services()] == [id(s) for s in before]
    changed = _selecting_entry()
    changed["spec"]["ports"][0]["targetPort"] = 9090
    add(store, changed)
    (after,) = registry.services()
    assert after is not before[0] and after.ports[0].target_port == 9090
