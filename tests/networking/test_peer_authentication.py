"""PeerAuthentication resolved as istiod resolves it (model/peer_authentication.py)."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format

from meshpilot._proto.istio.security.v1beta1 import peer_authentication_pb2
from meshpilot.model.config import Config, ConfigMeta
from meshpilot.model.kind import Kind
from meshpilot.model.peer_authentication import MtlsMode, PeerAuthenticationIndex, WorkloadMtls

ROOT = "istio-system"
API = {"app": "api", "version": "v1"}


def pa(name: str, namespace: str, spec: dict[str, Any], created: str = "") -> Config:
    message = json_format.ParseDict(spec, peer_authentication_pb2.PeerAuthentication())
    meta = ConfigMeta(Kind.PEER_AUTHENTICATION, name, namespace, creation_timestamp=created)
    return Config(meta, message)


def mode(value: str) -> dict[str, Any]:
    return {"mtls": {"mode": value}}


def selected(labels: dict[str, str], value: str | None = None, **ports: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"selector": {"matchLabels": labels}}
    if value is not None:
        spec["mtls"] = {"mode": value}
    if ports:
        spec["portLevelMtls"] = {port.removeprefix("p"): {"mode": m} for port, m in ports.items()}
    return spec


def resolve(*configs: Config, namespace: str = "default", labels: dict[str, str] = API) -> WorkloadMtls:
    return PeerAuthenticationIndex(configs, ROOT).for_workload(namespace, labels)


def test_without_policies_every_workload_is_permissive() -> None:
    index = PeerAuthenticationIndex([], ROOT)
    assert index.for_workload("default", API) == WorkloadMtls(MtlsMode.PERMISSIVE)
    assert index.namespace_mode("default") is MtlsMode.UNKNOWN
    assert index.service_mode("default") is MtlsMode.PERMISSIVE
    assert not index.any_disable


def test_mesh_namespace_workload_and_port_each_override_the_wider_scope() -> None:
    mesh = pa("default", ROOT, mode("STRICT"))
    namespace = pa("default", "default", mode("DISABLE"))
    workload = pa("api", "default", selected({"app": "api"}, "PERMISSIVE", p5432="STRICT"))
    assert resolve(mesh).mode is MtlsMode.STRICT
    assert resolve(mesh, namespace).mode is MtlsMode.DISABLE
    got = resolve(mesh, namespace, workload)
    assert got.mode is MtlsMode.PERMISSIVE
    assert got.for_port(5432) is MtlsMode.STRICT and got.for_port(9080) is MtlsMode.PERMISSIVE
    # Another namespace sees only the mesh policy.
    assert resolve(mesh, namespace, workload, namespace="other").mode is MtlsMode.STRICT


def test_unset_inherits_from_the_parent_scope() -> None:
    mesh = pa("default", ROOT, mode("DISABLE"))
    namespace = pa("default", "default", {"mtls": {}})
    workload = pa("api", "default", selected({"app": "api"}, None, p9080="UNSET", p5432="STRICT"))
    got = resolve(mesh, namespace, workload)
    assert got.mode is MtlsMode.DISABLE
    assert got.per_port == ((5432, MtlsMode.STRICT), (9080, MtlsMode.DISABLE))
    # A mesh policy with UNSET counts as PERMISSIVE for namespaces inheriting it.
    index = PeerAuthenticationIndex([pa("default", ROOT, {}), pa("default", "default", {})], ROOT)
    assert index.mesh_mode is MtlsMode.PERMISSIVE
    assert index.namespace_mode("default") is MtlsMode.PERMISSIVE


def test_the_oldest_policy_wins_then_the_name() -> None:
    old = pa("zz-old", "default", selected({"app": "api"}, "STRICT"), "2024-01-01T00:00:00Z")
    young = pa("aa-young", "default", selected({"app": "api"}, "DISABLE"), "2024-06-01T00:00:00Z")
    assert resolve(young, old).mode is MtlsMode.STRICT
    same_a = pa("a", "default", selected({"app": "api"}, "DISABLE"), "2024-01-01T00:00:00Z")
    same_b = pa("b", "default", selected({"version": "v1"}, "STRICT"), "2024-01-01T00:00:00Z")
    assert resolve(same_b, same_a).mode is MtlsMode.DISABLE
    # A policy without a creation time is Go's zero time: older than any.
    assert (
        resolve(old, pa("undated", "default", selected({"app": "api"}, "DISABLE"))).mode is MtlsMode.DISABLE
    )


def test_only_the_oldest_namespace_wide_policy_of_a_namespace_counts() -> None:
    first = pa("first", "default", mode("STRICT"), "2024-01-01T00:00:00Z")
    second = pa("second", "default", mode("DISABLE"), "2024-02-01T00:00:00Z")
    index = PeerAuthenticationIndex([second, first], ROOT)
    assert index.namespace_mode("default") is MtlsMode.STRICT
    assert index.for_workload("default", API).mode is MtlsMode.STRICT
    assert not index.any_disable, "the ignored policy's DISABLE cannot apply to any endpoint"


def test_a_selector_in_the_root_namespace_selects_nothing() -> None:
    root_selector = pa("api", ROOT, selected({"app": "api"}, "DISABLE"))
    assert resolve(root_selector).mode is MtlsMode.PERMISSIVE
    assert resolve(root_selector, namespace=ROOT).mode is MtlsMode.PERMISSIVE


def test_a_workload_policy_must_match_every_selector_label() -> None:
    policy = pa("api", "default", selected({"app": "api", "version": "v2"}, "STRICT"))
    assert resolve(policy).mode is MtlsMode.PERMISSIVE
    assert resolve(policy, labels={"app": "api", "version": "v2"}).mode is MtlsMode.STRICT


def test_service_mode_reads_only_namespace_and_mesh_policies() -> None:
    index = PeerAuthenticationIndex(
        [
            pa("default", ROOT, mode("STRICT")),
            pa("default", "legacy", mode("DISABLE")),
            pa("api", "default", selected({"app": "api"}, "DISABLE")),
        ],
        ROOT,
    )
    assert index.service_mode("legacy") is MtlsMode.DISABLE
    assert index.service_mode("default") is MtlsMode.STRICT, "workload policies are not read"


def test_the_fingerprint_follows_every_policy() -> None:
    a = PeerAuthenticationIndex([pa("default", "default", mode("STRICT"))], ROOT)
    b = PeerAuthenticationIndex([pa("default", "default", mode("PERMISSIVE"))], ROOT)
    c = PeerAuthenticationIndex([pa("default", "default", mode("STRICT"))], ROOT)
    assert a.fingerprint != b.fingerprint and a.fingerprint == c.fingerprint
