"""A sidecar's own parts of its listener keys, kept on its LDS subscription from push to push
(``generators.lds_keys``).

Kept across a change that cannot alter them (a VirtualService), worked out again after any change
to what they read (policies, Telemetry, MeshConfig, services, the proxy's labels): each such case
checks that the kept subscription gets exactly the listeners a new one gets, and, for the security
inputs, that those listeners did change (a stale key there would fail open).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from support.kube import istio, pod, service, workload
from support.mesh_objects import CLIENT, mesh_objects
from support.model import Model, build

from meshpilot.model.mesh import apply_mesh_config
from meshpilot.model.peer_authentication import MtlsMode, WorkloadMtls
from meshpilot.model.proxy import Proxy
from meshpilot.model.push_request import PushRequest
from meshpilot.server.metrics import Metrics
from meshpilot.xds.cache import XdsCache
from meshpilot.xds.connection import WatchedResource
from meshpilot.xds.generators import lds_keys
from meshpilot.xds.generators.base import GenerationContext
from meshpilot.xds.generators.lds import ListenerGenerator
from meshpilot.xds.types import TypeUrl


class Stream:
    """One proxy's LDS subscription across snapshots, as a stream keeps it."""

    def __init__(self, model: Model, node_id: str = CLIENT) -> None:
        self.model = model
        self.proxy = model.proxy(node_id)
        self.watch = WatchedResource(TypeUrl.LISTENER.value, wildcard=True)
        self.cache: XdsCache | None = None

    def listeners(self, watch: WatchedResource | None = None) -> dict[str, bytes]:
        push = self.model.push
        ctx = GenerationContext(self.proxy, push, self.model.index, PushRequest(push=push), cache=self.cache)
        found = ListenerGenerator().generate(ctx, watch or self.watch, None) or []
        return {r.name: r.payload for r in found}

    def fresh(self) -> dict[str, bytes]:
        """What a new subscription gets from the same snapshot."""
        return self.listeners(WatchedResource(TypeUrl.LISTENER.value, wildcard=True))

    def next_snapshot(self) -> None:
        env = self.model.env
        self.model.push = env.build_push_context(f"test/{id(object())}")
        env.refresh_proxy(self.proxy, self.model.push)


@pytest.fixture
def worked_out(monkeypatch: pytest.MonkeyPatch) -> list[Proxy]:
    """The proxies whose keys were worked out (not kept), in order."""
    calls: list[Proxy] = []
    real = lds_keys._work_out

    def counting(proxy: Proxy, push: Any) -> Any:
        calls.append(proxy)
        return real(proxy, push)

    monkeypatch.setattr(lds_keys, "_work_out", counting)
    return calls


ROUTE = istio(
    "VirtualService",
    "reviews",
    "default",
    {"hosts": ["reviews"], "http": [{"route": [{"destination": {"host": "reviews", "subset": "v1"}}]}]},
)


def test_a_virtual_service_change_keeps_them_and_the_listeners_are_a_new_subscriptions(
    worked_out: list[Proxy],
) -> None:
    stream = Stream(build(mesh_objects()))
    stream.listeners()
    assert len(worked_out) == 1
    stream.model.upsert(ROUTE)
    stream.next_snapshot()
    kept = stream.listeners()
    assert len(worked_out) == 1, "a VirtualService reads none of them: kept"
    assert kept == stream.fresh()


def _deny(model: Model, name: str, labels: dict[str, str]) -> None:
    spec = {"selector": {"matchLabels": labels}, "action": "DENY", "rules": [{}]}
    model.upsert(istio("AuthorizationPolicy", name, "default", spec, group="security"))


def _deny_all(model: Model) -> None:
    _deny(model, "deny-productpage", {"app": "productpage"})


def _strict(model: Model) -> None:
    model.upsert(
        istio("PeerAuthentication", "strict", "default", {"mtls": {"mode": "STRICT"}}, group="security"),
    )


def _access_logs(model: Model) -> None:
    model.upsert(
        istio(
            "Telemetry",
            "logs",
            "default",
            {"accessLogging": [{"providers": [{"name": "envoy"}]}]},
            group="telemetry",
        ),
    )


def _jwt_rule(model: Model) -> None:
    model.upsert(_REQUEST_AUTHENTICATION)


def _trust_domain_alias(model: Model) -> None:
    model.env.mesh = apply_mesh_config("trustDomainAliases: [old.example]\n")


def _mesh_tracing(model: Model) -> None:
    model.env.mesh = apply_mesh_config("enableTracing: true\ndefaultConfig:\n  tracing:\n    sampling: 42\n")


def _collector_service(model: Model) -> None:
    # The collector of a provider a Telemetry object names: whether it exists decides its loggers.
    model.upsert(service("collector", "default", "10.96.0.90", [("grpc", 4317)], {"app": "collector"}))


_PROVIDER_MESH = """
extensionProviders:
- name: otel
  envoyOtelAls:
    service: collector.default.svc.cluster.local
    port: 4317
"""


@pytest.mark.parametrize(
    "change",
    [_deny_all, _strict, _jwt_rule, _access_logs, _mesh_tracing],
    ids=["authorization-policy", "peer-authentication", "request-authentication", "telemetry", "mesh-config"],
)
def test_a_change_to_what_they_read_works_them_out_again(
    worked_out: list[Proxy], change: Callable[[Model], None]
) -> None:
    stream = Stream(build(mesh_objects()))
    before = stream.listeners()
    change(stream.model)
    stream.next_snapshot()
    after = stream.listeners()
    assert len(worked_out) == 2
    assert after == stream.fresh()
    assert after != before, "the change reaches the listeners"


def test_a_policy_that_comes_to_select_the_proxy_by_new_labels_applies(worked_out: list[Proxy]) -> None:
    model = build(mesh_objects())
    _deny(model, "deny-front", {"tier": "front"})
    model.push = model.env.build_push_context("test/policy")
    stream = Stream(model)
    before = stream.listeners()
    # Nothing but the pod's labels changes now.
    model.upsert(pod("productpage-v1", "default", "10.1.0.11", {"app": "productpage", "tier": "front"}))
    stream.next_snapshot()
    after = stream.listeners()
    assert len(worked_out) == 2
    assert after == stream.fresh()
    assert after != before, "the DENY policy now selects it"


def test_a_new_service_works_them_out_again(worked_out: list[Proxy]) -> None:
    docs = [
        *mesh_objects(),
        istio(
            "Telemetry",
            "logs",
            "default",
            {"accessLogging": [{"providers": [{"name": "otel"}]}]},
            group="telemetry",
        ),
    ]
    stream = Stream(build(docs, _PROVIDER_MESH))
    before = stream.listeners()
    _collector_service(stream.model)
    stream.next_snapshot()
    after = stream.listeners()
    assert len(worked_out) == 2
    assert after == stream.fresh()
    assert after != before, "the provider's collector now exists: its logger is configured"


_REQUEST_AUTHENTICATION = istio(
    "RequestAuthentication",
    "jwt",
    "default",
    {
        "selector": {"matchLabels": {"app": "productpage"}},
        "jwtRules": [{"issuer": "https://issuer.example", "jwksUri": "https://issuer.example/jwks"}],
    },
    group="security",
)


def test_a_proxy_a_request_authentication_selects_keeps_nothing(worked_out: list[Proxy]) -> None:
    stream = Stream(build([*mesh_objects(), _REQUEST_AUTHENTICATION]))
    stream.listeners()
    assert stream.watch.kept is None, "its key names fetched JWKS, which change with no config change"
    stream.next_snapshot()
    stream.listeners()
    assert len(worked_out) == 2


def test_without_shared_outputs_nothing_is_kept(worked_out: list[Proxy]) -> None:
    model = build(mesh_objects())
    model.env.share_outputs = False
    model.push = model.env.build_push_context("test/unshared")
    stream = Stream(model)
    stream.listeners()
    assert stream.watch.kept is None
    stream.next_snapshot()
    stream.listeners()
    assert len(worked_out) == 2


def test_a_trust_domain_alias_reaches_a_policys_principals(worked_out: list[Proxy]) -> None:
    allow = istio(
        "AuthorizationPolicy",
        "allow-reviews",
        "default",
        {
            "selector": {"matchLabels": {"app": "productpage"}},
            "rules": [{"from": [{"source": {"principals": ["cluster.local/ns/default/sa/reviews"]}}]}],
        },
        group="security",
    )
    stream = Stream(build([*mesh_objects(), allow]))
    before = stream.listeners()
    _trust_domain_alias(stream.model)
    stream.next_snapshot()
    after = stream.listeners()
    assert len(worked_out) == 2
    assert after == stream.fresh()
    assert after != before, "the alias's principals are allowed too"


def test_a_subscription_handed_to_another_proxy_does_not_give_it_the_first_ones_keys(
    worked_out: list[Proxy],
) -> None:
    # The same labels in another namespace, which a STRICT PeerAuthentication does not cover.
    docs = [
        *mesh_objects(),
        *workload("productpage", "other", "10.96.0.11", 9080, {"productpage-x": "10.1.0.12"}),
        istio("PeerAuthentication", "strict", "default", {"mtls": {"mode": "STRICT"}}, group="security"),
    ]
    model = build(docs)
    first = Stream(model)
    first.listeners()
    second = Stream(model, "sidecar~10.1.0.12~productpage-x.other~other.svc.cluster.local")
    assert second.proxy.labels == first.proxy.labels
    second.watch = first.watch
    second.listeners()
    assert [p.id for p in worked_out] == [first.proxy.id, second.proxy.id], "worked out for each"
    kept = second.watch.kept
    assert isinstance(kept, lds_keys._Kept)
    assert kept.proxy is second.proxy
    assert kept.keys.mtls.mode is MtlsMode.PERMISSIVE, "the STRICT policy is the first one's namespace's"


def test_with_runtime_assertions_a_kept_key_that_misses_an_input_is_caught() -> None:
    metrics = Metrics()
    model = build(mesh_objects())
    stream = Stream(model)
    stream.cache = XdsCache(10, metrics, verify=True)
    stream.listeners()
    stream.next_snapshot()
    stream.listeners()
    mismatches = metrics.registry.get_sample_value("meshpilot_xds_cache_mismatches_total", {"type": "lds"})
    assert not mismatches, "kept keys that read nothing changed agree with fresh ones"
    kept = stream.watch.kept
    assert isinstance(kept, lds_keys._Kept)
    # As if what they read had changed unseen: the kept keys name another PeerAuthentication.
    stale = dataclasses.replace(kept.keys, mtls=WorkloadMtls(MtlsMode.DISABLE))
    stream.watch.kept = dataclasses.replace(kept, keys=stale)
    assert stream.listeners() == stream.fresh(), "the fresh keys are the ones used"
    assert metrics.registry.get_sample_value("meshpilot_xds_cache_mismatches_total", {"type": "lds"}) == 1
    stream.listeners()
    assert metrics.registry.get_sample_value("meshpilot_xds_cache_mismatches_total", {"type": "lds"}) == 1, (
        "the fresh keys are kept in place of the stale ones"
    )
