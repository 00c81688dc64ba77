"""A full push's refresh of a proxy's state: what it reads again, and what it keeps while its inputs hold."""

from __future__ import annotations

from typing import Any

import pytest
from support.kube import pod, service
from support.model import Model, build

from meshpilot.model.kind import Kind
from meshpilot.model.proxy import Proxy
from meshpilot.registry.aggregate import AggregateRegistry

NODE_ID = "sidecar~10.1.0.11~app-1.default~default.svc.cluster.local"


def _node(zone: str) -> dict[str, Any]:
    labels = {"topology.kubernetes.io/region": "r1", "topology.kubernetes.io/zone": zone}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": labels}}


def _pod(**labels: str) -> dict[str, Any]:
    return pod("app-1", "default", "10.1.0.11", {"app": "app", **labels}, node="n1")


@pytest.fixture
def model() -> Model:
    return build(
        [service("app", "default", "10.96.0.10", [("http", 9080)], {"app": "app"}), _node("z1"), _pod()]
    )


class _Counting:
    """Counts what the refresh asks the registry for labels and locality."""

    def __init__(self, registry: AggregateRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
        self.asked = 0
        for name in ("workload_labels", "proxy_locality"):
            monkeypatch.setattr(registry, name, self._counted(getattr(registry, name)))

    def _counted(self, method: Any) -> Any:
        def counted(proxy: Proxy) -> Any:
            self.asked += 1
            return method(proxy)

        return counted


def _refresh(model: Model, proxy: Proxy, version: str) -> None:
    model.env.refresh_proxy(proxy, model.env.build_push_context(version))


def test_labels_and_locality_are_read_again_only_when_the_pod_its_node_or_a_service_changes(
    model: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = model.proxy(NODE_ID)
    assert proxy.labels["app"] == "app" and proxy.locality.label == "r1/z1/"
    counting = _Counting(model.env.registry, monkeypatch)

    first = proxy.state
    _refresh(model, proxy, "test/2")
    assert counting.asked == 0
    assert proxy.labels is first.labels and proxy.locality is first.locality
    assert proxy.state is not first and proxy.sidecar_scope is not first.sidecar_scope  # a new snapshot's

    model.upsert(_node("z2"))
    _refresh(model, proxy, "test/3")
    assert counting.asked == 2
    assert proxy.locality.label == "r1/z2/" and proxy.labels["topology.kubernetes.io/zone"] == "z2"

    model.upsert(_pod(version="v2"))
    _refresh(model, proxy, "test/4")
    assert counting.asked == 4
    assert proxy.labels["version"] == "v2"

    # The Node gone: no locality from it any more.
    model.env.registry.workloads[0].remove(Kind.NODE, "", "n1")
    _refresh(model, proxy, "test/4b")
    assert counting.asked == 6
    assert proxy.locality.label == "" and proxy.labels["version"] == "v2"

    # The Pod gone: the labels are the proxy's own again (none here but the topology's).
    model.env.registry.workloads[0].remove(Kind.POD, "default", "app-1")
    _refresh(model, proxy, "test/5")
    assert counting.asked == 8
    assert "app" not in proxy.labels and proxy.locality.label == ""


def test_a_proxy_without_a_pod_keeps_its_own_labels_between_refreshes(
    model: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = model.proxy("sidecar~10.1.9.9~vm.default~default.svc.cluster.local", {"LABELS": {"app": "vm"}})
    counting = _Counting(model.env.registry, monkeypatch)
    _refresh(model, proxy, "test/2")
    assert counting.asked == 0 and proxy.labels["app"] == "vm"
    # A Pod appears at its address: read from the registry from now on.
    model.upsert(pod("vm", "default", "10.1.9.9", {"app": "now-a-pod"}))
    _refresh(model, proxy, "test/3")
    assert counting.asked == 2 and proxy.labels["app"] == "now-a-pod"


def test_the_inbound_signature_is_kept_while_the_service_targets_are_the_same(model: Model) -> None:
    proxy = model.proxy(NODE_ID)
    signature = proxy.inbound_signature
    assert signature != ()
    _refresh(model, proxy, "test/2")
    assert proxy.inbound_signature is signature
    proxy.state = proxy.state.settled()
    assert proxy.inbound_signature is signature
    # Another port: other targets, worked out again.
    model.upsert(service("app", "default", "10.96.0.10", [("http", 9080), ("grpc", 9090)], {"app": "app"}))
    _refresh(model, proxy, "test/3")
    assert proxy.inbound_signature != signature and len(proxy.inbound_signature) == 2


def test_the_service_targets_are_kept_until_the_pod_or_a_service_changes(
    model: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full push refreshes every proxy: while its Pod, its Node and the services are the objects they
    were, the targets are kept without asking the registry; a Service that selects the unchanged Pod
    is found."""
    proxy = model.proxy(NODE_ID)
    targets = proxy.service_targets
    assert [(t.service.name, t.port.port) for t in targets] == [("app", 9080)]
    asked: list[str] = []
    registry = model.env.registry
    looked_up = registry.service_targets

    def counted(asking: Proxy) -> Any:
        asked.append(asking.id)
        return looked_up(asking)

    monkeypatch.setattr(registry, "service_targets", counted)
    _refresh(model, proxy, "test/2")
    assert proxy.service_targets is targets and asked == []
    # A resync converts each Service again: an equal one changes nothing.
    model.upsert(service("app", "default", "10.96.0.10", [("http", 9080)], {"app": "app"}))
    _refresh(model, proxy, "test/3")
    assert proxy.service_targets is targets and asked == []

    model.upsert(service("admin", "default", "10.96.0.99", [("http-admin", 7070)], {"app": "app"}))
    _refresh(model, proxy, "test/4")
    assert asked == ["app-1.default"]
    found = sorted((t.service.name, t.port.port) for t in proxy.service_targets)
    assert found == [("admin", 7070), ("app", 9080)]
