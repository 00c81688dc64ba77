"""ServiceEntries and the WorkloadEntries they select, as services and endpoints."""

from __future__ import annotations

from typing import Any

from support.kube import istio
from support.updater import Updater

from meshpilot.config.decode import decode_object
from meshpilot.config.store import ConfigStore
from meshpilot.model.config import Config, ConfigKey
from meshpilot.model.kind import Kind
from meshpilot.model.protocol import Protocol
from meshpilot.model.service import Registry, Resolution
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
