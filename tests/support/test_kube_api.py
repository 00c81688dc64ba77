"""KubeApiServer through the official client over HTTP: what informers and leader election rely on."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import config as k8s_config
from kubernetes.client import (
    ApiClient,
    CoordinationV1Api,
    CoreV1Api,
    CustomObjectsApi,
    DiscoveryV1Api,
    V1Lease,
    V1LeaseSpec,
    V1ObjectMeta,
)
from kubernetes.client.rest import ApiException
from kubernetes.watch import Watch
from support.kube import endpoint_slice, pod, service
from support.kube_api import KubeApiServer
from support.kube_selectors import SelectorError, field_selector, label_selector

Event = tuple[str, str, str]  # type, name, resourceVersion

pytestmark = pytest.mark.timeout(15)


@pytest.fixture
def kube() -> Iterator[KubeApiServer]:
    with KubeApiServer(history_limit=50) as server:
        yield server


@pytest.fixture
def api(kube: KubeApiServer) -> Iterator[ApiClient]:
    with kube.api_client() as client:
        yield client


def watch(
    list_fn: Callable[..., Any], *args: Any, count: int, timeout: int = 2, **kwargs: Any
) -> list[Event]:
    """Up to ``count`` events of a watch; the server's timeoutSeconds bounds the wait."""
    events: list[Event] = []
    w = Watch()
    for event in w.stream(list_fn, *args, timeout_seconds=timeout, _request_timeout=timeout + 3, **kwargs):
        meta = event["raw_object"]["metadata"]
        events.append((event["type"], meta.get("name", ""), meta["resourceVersion"]))
        if len(events) == count:
            w.stop()
            break
    return events


def raw_lines(response: Any) -> Iterator[dict[str, Any]]:
    """Decoded watch events of a raw (``_preload_content=False``) response, as they arrive."""
    buffer = b""
    for chunk in response.stream(amt=None, decode_content=False):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            yield json.loads(line)


def test_writes_stamp_a_cluster_wide_increasing_resource_version(kube: KubeApiServer, api: ApiClient) -> None:
    v1 = CoreV1Api(api)
    body = pod("a", "", "10.0.0.1", {"app": "a"})
    del body["metadata"]["namespace"]
    created = v1.create_namespaced_pod("default", body)
    svc = v1.create_namespaced_service("other", service("s", "other", "10.96.0.1", [("http", 80)]))
    patched = v1.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"v": "2"}}})

    assert created.metadata.namespace == "default"
    assert created.metadata.uid and created.metadata.creation_timestamp is not None
    versions = [int(o.metadata.resource_version) for o in (created, svc, patched)]
    assert versions == sorted(set(versions))
    assert patched.metadata.labels == {"app": "a", "v": "2"}
    assert patched.metadata.uid == created.metadata.uid

    pods = v1.list_pod_for_all_namespaces()
    assert pods.metadata.resource_version == str(kube.resource_version) == str(versions[-1])
    assert [p.metadata.name for p in pods.items] == ["a"]
    raw = json.loads(v1.list_namespaced_service("other", _preload_content=False).data)
    assert (raw["kind"], raw["apiVersion"]) == ("ServiceList", "v1")
    assert v1.list_namespaced_service("default").items == []


def test_watch_resumes_after_a_resource_version(kube: KubeApiServer, api: ApiClient) -> None:
    v1 = CoreV1Api(api)
    a = kube.apply(pod("a", "ns", "10.0.0.1", {"app": "a"}))
    kube.apply(pod("b", "ns", "10.0.0.2", {"app": "b"}))
    kube.apply(pod("a", "ns", "10.0.0.9", {"app": "a"}))
    deleted = kube.delete("pods", "ns", "b")

    events = watch(v1.list_namespaced_pod, "ns", count=3, resource_version=a["metadata"]["resourceVersion"])
    assert events == [("ADDED", "b", "2"), ("MODIFIED", "a", "3"), ("DELETED", "b", "4")]
    assert deleted["metadata"]["resourceVersion"] == "4"


def test_watch_without_resource_version_lists_then_follows(kube: KubeApiServer, api: ApiClient) -> None:
    kube.apply(pod("a", "ns", "10.0.0.1", {}))
    response = CoreV1Api(api).list_pod_for_all_namespaces(
        watch=True, timeout_seconds=3, _preload_content=False, _request_timeout=5
    )
    events = raw_lines(response)
    assert next(events)["type"] == "ADDED"
    kube.apply(pod("b", "other", "10.0.0.2", {}))
    kube.delete("Pod", "ns", "a")
    follow = [next(events), next(events)]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in follow] == [
        ("ADDED", "b"),
        ("DELETED", "a"),
    ]
    response.release_conn()


def test_expired_resource_version_answers_410_in_the_stream(kube: KubeApiServer, api: ApiClient) -> None:
    v1 = CoreV1Api(api)
    kube.apply(pod("a", "ns", "10.0.0.1", {}))
    kube.apply(pod("b", "ns", "10.0.0.2", {}))
    kube.compact()
    response = v1.list_namespaced_pod("ns", watch=True, resource_version="1", _preload_content=False)
    assert response.status == 200
    (error,) = list(raw_lines(response))
    assert error["type"] == "ERROR"
    assert error["object"]["code"] == 410 and error["object"]["reason"] == "Expired"
    with pytest.raises(ApiException) as raised:
        watch(v1.list_namespaced_pod, "ns", count=1, resource_version="1")
    assert raised.value.status == 410
    # After the compaction, a resume from the current version works.
    current = str(kube.resource_version)
    kube.apply(pod("c", "ns", "10.0.0.3", {}))
    assert watch(v1.list_namespaced_pod, "ns", count=1, resource_version=current) == [("ADDED", "c", "3")]


def test_history_keeps_the_newest_events_only(kube: KubeApiServer, api: ApiClient) -> None:
    for i in range(52):  # two more than history_limit: the events of versions 1 and 2 are gone
        kube.apply(pod("a", "ns", f"10.0.0.{i}", {}))
    v1 = CoreV1Api(api)
    with pytest.raises(ApiException) as raised:
        watch(v1.list_namespaced_pod, "ns", count=1, resource_version="1")
    assert raised.value.status == 410
    assert watch(v1.list_namespaced_pod, "ns", count=1, resource_version="2") == [("MODIFIED", "a", "3")]


@pytest.mark.parametrize(
    ("labels", "fields", "expected"),
    [
        ("app=a", "", ["a1", "a2"]),
        ("app==a,tier!=db", "", ["a1"]),
        ("app in (a, b),tier", "", ["a2", "b"]),
        ("app notin (a)", "", ["b", "c"]),
        ("!tier", "", ["a1", "c"]),
        ("", "metadata.name=b", ["b"]),
        ("app=a", "metadata.name!=a1,metadata.namespace=ns", ["a2"]),
    ],
)
def test_selectors_on_list_and_watch(
    kube: KubeApiServer, api: ApiClient, labels: str, fields: str, expected: list[str]
) -> None:
    for name, pod_labels in [
        ("a1", {"app": "a"}),
        ("a2", {"app": "a", "tier": "db"}),
        ("b", {"app": "b", "tier": "web"}),
        ("c", {}),
    ]:
        kube.apply(pod(name, "ns", "10.0.0.1", pod_labels))
    v1 = CoreV1Api(api)
    listed = v1.list_namespaced_pod("ns", label_selector=labels, field_selector=fields)
    assert sorted(p.metadata.name for p in listed.items) == expected
    events = watch(
        v1.list_pod_for_all_namespaces, count=len(expected), label_selector=labels, field_selector=fields
    )
    assert sorted(name for _, name, _ in events) == expected


def test_an_object_leaving_a_selector_is_deleted_for_that_watcher(
    kube: KubeApiServer, api: ApiClient
) -> None:
    start = kube.apply(pod("a", "ns", "10.0.0.1", {"app": "a"}))["metadata"]["resourceVersion"]
    kube.apply(pod("a", "ns", "10.0.0.1", {"app": "other"}))
    kube.apply(pod("a", "ns", "10.0.0.1", {"app": "a"}))
    events = watch(
        CoreV1Api(api).list_namespaced_pod, "ns", count=2, resource_version=start, label_selector="app=a"
    )
    assert [(kind, rv) for kind, _, rv in events] == [("DELETED", "2"), ("ADDED", "3")]


def test_a_bad_selector_is_a_bad_request(api: ApiClient) -> None:
    with pytest.raises(ApiException) as raised:
        CoreV1Api(api).list_namespaced_pod("ns", field_selector="spec.nodeName=x")
    assert raised.value.status == 400


def test_stale_replace_conflicts_as_lease_election_expects(api: ApiClient) -> None:
    leases = CoordinationV1Api(api)
    lease = V1Lease(metadata=V1ObjectMeta(name="istio-leader"), spec=V1LeaseSpec(holder_identity="one"))
    created = leases.create_namespaced_lease("istio-system", lease)
    created.spec.holder_identity = "two"
    renewed = leases.replace_namespaced_lease("istio-leader", "istio-system", created)
    assert renewed.spec.holder_identity == "two"

    created.spec.holder_identity = "three"  # still carries the first resourceVersion
    with pytest.raises(ApiException) as raised:
        leases.replace_namespaced_lease("istio-leader", "istio-system", created)
    assert raised.value.status == 409
    assert json.loads(raised.value.body)["reason"] == "Conflict"
    assert leases.read_namespaced_lease("istio-leader", "istio-system").spec.holder_identity == "two"


def test_missing_and_duplicate_objects(api: ApiClient) -> None:
    v1 = CoreV1Api(api)
    body = pod("a", "ns", "10.0.0.1", {})
    v1.create_namespaced_pod("ns", body)
    calls: list[tuple[int, Callable[[], Any]]] = [
        (409, lambda: v1.create_namespaced_pod("ns", body)),
        (404, lambda: v1.read_namespaced_pod("b", "ns")),
        (404, lambda: v1.replace_namespaced_pod("b", "ns", pod("b", "ns", "10.0.0.2", {}))),
        (404, lambda: v1.patch_namespaced_pod("b", "ns", {"metadata": {"labels": {"x": "y"}}})),
        (404, lambda: v1.delete_namespaced_pod("b", "ns")),
        (404, lambda: v1.read_namespaced_pod("a", "other")),
        (404, lambda: v1.read_namespaced_pod_ephemeralcontainers("a", "ns")),  # only status is served
        (404, lambda: CustomObjectsApi(api).list_cluster_custom_object("example.com", "v1", "widgets")),
    ]
    for status, call in calls:
        with pytest.raises(ApiException) as raised:
            call()
        assert raised.value.status == status
        assert json.loads(raised.value.body)["kind"] == "Status"
    v1.delete_namespaced_pod("a", "ns")
    assert v1.list_namespaced_pod("ns").items == []


def test_restart_keeps_state_and_port_and_ends_open_watches(kube: KubeApiServer, api: ApiClient) -> None:
    v1 = CoreV1Api(api)
    kube.apply(pod("a", "ns", "10.0.0.1", {}))
    url = kube.url
    response = v1.list_namespaced_pod("ns", watch=True, _preload_content=False, _request_timeout=5)
    events = raw_lines(response)
    assert next(events)["type"] == "ADDED"

    kube.restart()
    assert list(events) == []  # the stream ended
    assert kube.url == url
    kube.apply(pod("b", "ns", "10.0.0.2", {}))
    listed = v1.list_namespaced_pod("ns")
    assert [p.metadata.name for p in listed.items] == ["a", "b"]
    assert listed.metadata.resource_version == "2"


def test_stop_closes_the_port(kube: KubeApiServer) -> None:
    url = kube.url
    kube.stop()
    with kube.api_client() as client, pytest.raises(Exception, match=r"(?i)refused|Max retries"):
        CoreV1Api(client).list_namespaced_pod("ns", _request_timeout=1)
    kube.start()
    assert kube.url == url


def test_timeout_seconds_ends_the_watch(kube: KubeApiServer, api: ApiClient) -> None:
    kube.apply(pod("a", "ns", "10.0.0.1", {}))
    started = time.monotonic()
    response = CoreV1Api(api).list_namespaced_pod(
        "ns", watch=True, resource_version="1", timeout_seconds=1, _preload_content=False, _request_timeout=5
    )
    assert list(raw_lines(response)) == []  # nothing after version 1
    assert 0.9 < time.monotonic() - started < 3


def test_bookmarks_reach_watches_that_allow_them(kube: KubeApiServer, api: ApiClient) -> None:
    kube.apply(pod("a", "ns", "10.0.0.1", {}))
    response = CoreV1Api(api).list_namespaced_pod(
        "ns",
        watch=True,
        resource_version="1",
        allow_watch_bookmarks=True,
        _preload_content=False,
        _request_timeout=5,
    )
    events = raw_lines(response)
    kube.bookmark()
    bookmark = next(events)
    assert bookmark["type"] == "BOOKMARK"
    assert bookmark["object"]["metadata"]["resourceVersion"] == "1"
    response.release_conn()


def test_istio_resources_through_custom_objects(kube: KubeApiServer, api: ApiClient) -> None:
    custom = CustomObjectsApi(api)
    vs = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": "reviews"},
        "spec": {"hosts": ["reviews"]},
    }
    group = "networking.istio.io"
    custom.create_namespaced_custom_object(group, "v1", "ns", "virtualservices", vs)
    patched = custom.patch_namespaced_custom_object(
        group, "v1", "ns", "virtualservices", "reviews", {"spec": {"gateways": ["mesh"]}}
    )
    assert patched["spec"] == {"hosts": ["reviews"], "gateways": ["mesh"]}
    assert patched["metadata"]["generation"] == 2

    listed = custom.list_cluster_custom_object(group, "v1alpha3", "virtualservices")
    assert listed["kind"] == "VirtualServiceList"
    assert [o["metadata"]["name"] for o in listed["items"]] == ["reviews"]
    events = watch(custom.list_namespaced_custom_object, group, "v1beta1", "ns", "virtualservices", count=1)
    assert events == [("ADDED", "reviews", "2")]

    policy = {"apiVersion": "security.istio.io/v1", "kind": "PeerAuthentication", "metadata": {"name": "p"}}
    custom.create_namespaced_custom_object("security.istio.io", "v1", "ns", "peerauthentications", policy)
    custom.delete_namespaced_custom_object(group, "v1", "ns", "virtualservices", "reviews")
    assert kube.objects("VirtualService") == []
    assert [o["metadata"]["name"] for o in kube.objects("peerauthentications", "ns")] == ["p"]


def test_endpoint_slices_and_cluster_scoped_resources(kube: KubeApiServer, api: ApiClient) -> None:
    slice_ = endpoint_slice("s-1", "ns", "s", [("http", 80)], [("p", "10.0.0.1")])
    DiscoveryV1Api(api).create_namespaced_endpoint_slice("ns", slice_)
    assert kube.get("EndpointSlice", "ns", "s-1") is not None
    v1 = CoreV1Api(api)
    v1.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}})
    v1.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"zone": "a"}}})
    assert [n.metadata.name for n in v1.list_node(label_selector="zone=a").items] == ["n1"]
    assert [n.metadata.name for n in v1.list_namespace().items] == ["ns"]


def test_injected_failures_and_request_counts(kube: KubeApiServer, api: ApiClient) -> None:
    v1 = CoreV1Api(api)
    kube.fail_next(1, status=503)
    with pytest.raises(ApiException) as raised:
        v1.list_namespaced_pod("ns")
    assert raised.value.status == 503
    v1.list_namespaced_pod("ns")
    assert kube.request_count("GET", "/api/v1/namespaces/ns/pods") == 2


def test_kubeconfig_reaches_the_server(kube: KubeApiServer, tmp_path: Path) -> None:
    kube.apply(pod("a", "ns", "10.0.0.1", {}))
    path = kube.write_kubeconfig(tmp_path / "kubeconfig", name="test", namespace="ns")
    with k8s_config.new_client_from_config(str(path)) as client:
        assert [p.metadata.name for p in CoreV1Api(client).list_namespaced_pod("ns").items] == ["a"]


@pytest.mark.parametrize("selector", ["a in (x", "=b", "a b"])
def test_unparseable_label_selectors(selector: str) -> None:
    with pytest.raises(SelectorError):
        label_selector(selector)


def test_selector_predicates() -> None:
    obj = {"metadata": {"name": "n", "namespace": "ns", "labels": {"a": "1", "b": "2"}}}
    assert label_selector("a in (1,3), b!=3, !c")(obj)
    assert not label_selector("a notin (1)")(obj)
    assert field_selector("metadata.name==n")(obj)
    with pytest.raises(SelectorError):
        field_selector("spec.x=1")


def test_discovery_lists_the_served_resources(kube: KubeApiServer) -> None:
    with urllib.request.urlopen(f"{kube.url}/api/v1", timeout=5) as response:
        core = json.load(response)
    assert {"pods", "namespaces", "services"} <= {r["name"] for r in core["resources"]}
    with urllib.request.urlopen(f"{kube.url}/apis", timeout=5) as response:
        groups = {g["name"] for g in json.load(response)["groups"]}
    assert {"networking.istio.io", "security.istio.io", "coordination.k8s.io"} <= groups


def test_another_process_reaches_the_server_through_the_kubeconfig(
    kube: KubeApiServer, tmp_path: Path
) -> None:
    kube.apply(pod("a", "ns", "10.0.0.1", {}))
    path = kube.write_kubeconfig(tmp_path / "kubeconfig")
    script = (
        "import sys; from kubernetes import client, config; config.load_kube_config(sys.argv[1]);"
        "print(*[p.metadata.name for p in client.CoreV1Api().list_namespaced_pod('ns').items])"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=30, check=True
    )
    assert done.stdout.split() == ["a"]


def test_status_subresource_changes_only_the_status(kube: KubeApiServer, api: ApiClient) -> None:
    custom = CustomObjectsApi(api)
    group = "networking.istio.io"
    vs = {
        "apiVersion": f"{group}/v1",
        "kind": "VirtualService",
        "metadata": {"name": "r"},
        "spec": {"hosts": ["r"]},
    }
    custom.create_namespaced_custom_object(group, "v1", "ns", "virtualservices", vs)
    body = {"spec": {"hosts": ["ignored"]}, "status": {"observedGeneration": 1}}
    written = custom.patch_namespaced_custom_object_status(group, "v1", "ns", "virtualservices", "r", body)
    assert written["status"] == {"observedGeneration": 1}
    assert written["spec"] == {"hosts": ["r"]}, "a status write leaves the spec alone"
    assert written["metadata"]["generation"] == 1
    assert int(written["metadata"]["resourceVersion"]) > 1


def test_stop_listening_refuses_connections_while_objects_still_change(kube: KubeApiServer) -> None:
    kube.stop_listening()
    with kube.api_client() as client, pytest.raises(Exception, match=r"(?i)refused|Max retries"):
        CoreV1Api(client).list_namespaced_pod("ns", _request_timeout=1)
    kube.apply(pod("late", "ns", "10.0.0.9", {}))
    kube.start_listening()
    with kube.api_client() as client:
        assert [p.metadata.name for p in CoreV1Api(client).list_namespaced_pod("ns").items] == ["late"]


def test_a_client_that_stopped_reading_loses_its_connection_when_the_server_stops() -> None:
    # A watch whose client reads nothing fills the server's write buffer; closing such a connection
    # waits for the buffer to drain, which it never does, and its socket would outlive the server.
    kube = KubeApiServer().start()
    try:
        with socket.create_connection((kube.host, kube.port)) as client:
            client.sendall(b"GET /api/v1/namespaces/ns/configmaps?watch=true HTTP/1.1\r\nHost: kube\r\n\r\n")
            data = {"v": "x" * 65536}
            for i in range(200):  # 13 MB of events, far more than loopback's socket buffers hold
                kube.apply(
                    {
                        "apiVersion": "v1",
                        "kind": "ConfigMap",
                        "metadata": {"name": f"c{i}", "namespace": "ns"},
                        "data": data,
                    }
                )
            kube.stop()
            client.settimeout(5)
            try:
                with contextlib.suppress(ConnectionResetError):
                    while client.recv(1 << 20):
                        pass  # what the kernel already holds, then the end
            except TimeoutError:
                pytest.fail("the server stopped with the connection still open")
    finally:
        kube.stop()
