"""Which Telemetry objects and defaultProviders apply to a proxy, and how they merge (as telemetry.go)."""

from __future__ import annotations

from typing import Any

import pytest
from support.kube import workload
from support.model import Model, build

from meshpilot.config.decode import decode_object
from meshpilot.model import telemetry
from meshpilot.model.config import ConfigKey
from meshpilot.model.kind import Kind
from meshpilot.model.push_request import PushRequest
from meshpilot.model.telemetry import TelemetryClass
from meshpilot.xds.dependencies import proxy_needs_push
from meshpilot.xds.generators import sidecar_generators
from meshpilot.xds.types import TypeUrl

API = "sidecar~10.1.0.5~api-1.default~default.svc.cluster.local"
OTHER = "sidecar~10.1.0.6~web-1.shop~shop.svc.cluster.local"

MESH = """
defaultProviders: {metrics: [prometheus]}
extensionProviders:
- {name: other-prom, prometheus: {}}
- {name: file-log, envoyFileAccessLog: {path: /dev/stdout}}
- {name: zipkin, zipkin: {service: zipkin.istio-system.svc.cluster.local, port: 9411}}
"""


def _telemetry(name: str, namespace: str, spec: dict[str, Any], when: str = "2026-01-01T00:00:00Z") -> Any:
    return {
        "apiVersion": "telemetry.istio.io/v1",
        "kind": "Telemetry",
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": when},
        "spec": spec,
    }


def _model(*telemetries: dict[str, Any], mesh: str = MESH) -> Model:
    docs = [
        *workload("api", "default", "10.96.0.5", 9080, {"api-1": "10.1.0.5"}),
        *workload("web", "shop", "10.96.0.6", 9080, {"web-1": "10.1.0.6"}),
        *telemetries,
    ]
    return build(docs, mesh)


def _api(model: Model) -> Any:
    return model.proxy(API, {"LABELS": {"app": "api"}})


def test_without_telemetry_objects_the_default_metrics_provider_applies_to_both_sides() -> None:
    model = _model()
    [found] = telemetry.metrics(model.push, _api(model))
    assert found.provider.name == "prometheus"
    assert found.client == found.server == telemetry.SideMetrics()
    assert found.reporting_interval is None
    assert telemetry.applicable(model.push, _api(model)).fingerprint == ()


def test_scopes_apply_root_then_namespace_then_selected_workload() -> None:
    root = _telemetry(
        "mesh",
        "istio-system",
        {
            "metrics": [
                {"overrides": [{"match": {"metric": "REQUEST_COUNT"}, "tagOverrides": {"a": {"value": "1"}}}]}
            ]
        },
    )
    namespace = _telemetry(
        "ns",
        "default",
        {
            "metrics": [
                {
                    "reportingInterval": "15s",
                    "overrides": [
                        {"match": {"metric": "REQUEST_COUNT"}, "tagOverrides": {"a": {"value": "2"}}}
                    ],
                }
            ]
        },
    )
    selected = _telemetry(
        "api",
        "default",
        {
            "selector": {"matchLabels": {"app": "api"}},
            "metrics": [
                {
                    "overrides": [
                        {
                            "match": {"metric": "REQUEST_COUNT", "mode": "SERVER"},
                            "tagOverrides": {"a": {"value": "3"}},
                        }
                    ]
                }
            ],
        },
    )
    model = _model(root, namespace, selected)
    [found] = telemetry.metrics(model.push, _api(model))
    client = {o.name: o for o in found.client.overrides}
    server = {o.name: o for o in found.server.overrides}
    assert client["REQUEST_COUNT"].tags == (telemetry.TagOverride("a", False, "2"),)
    assert server["REQUEST_COUNT"].tags == (telemetry.TagOverride("a", False, "3"),)
    assert found.reporting_interval.seconds == 15
    # Another namespace's proxy sees only the root namespace's object.
    [other] = telemetry.metrics(model.push, model.proxy(OTHER, {"LABELS": {"app": "api"}}))
    assert {o.name: o for o in other.client.overrides}["REQUEST_COUNT"].tags == (
        telemetry.TagOverride("a", False, "1"),
    )
    keys = [key.name for key, _ in telemetry.applicable(model.push, _api(model)).fingerprint]
    assert keys == ["mesh", "ns", "api"]


def test_a_selector_that_does_not_match_and_target_refs_do_not_apply() -> None:
    selected = _telemetry(
        "web-only",
        "default",
        {"selector": {"matchLabels": {"app": "web"}}, "metrics": [{"overrides": [{"disabled": True}]}]},
    )
    targeted = _telemetry(
        "gateway",
        "default",
        {
            "targetRefs": [{"kind": "Gateway", "group": "gateway.networking.k8s.io", "name": "gw"}],
            "metrics": [{"overrides": [{"disabled": True}]}],
        },
    )
    model = _model(selected, targeted)
    [found] = telemetry.metrics(model.push, _api(model))
    assert not found.client.disabled and not found.server.disabled
    by_name = {c.name: c for c in model.push.configs(Kind.TELEMETRY, "default")}
    assert telemetry.unapplied(by_name["gateway"]) is not None
    assert telemetry.unapplied(by_name["web-only"]) is None


def test_disabling_all_metrics_of_one_side_and_reenabling_lower_down() -> None:
    root = _telemetry("mesh", "istio-system", {"metrics": [{"overrides": [{"disabled": True}]}]})
    model = _model(root)
    [found] = telemetry.metrics(model.push, _api(model))
    assert found.client.disabled and found.server.disabled
    # A namespace override of the server side's metrics turns that side back on (istiod's merge).
    namespace = _telemetry(
        "ns",
        "default",
        {
            "metrics": [
                {"overrides": [{"match": {"metric": "REQUEST_SIZE", "mode": "SERVER"}, "disabled": True}]}
            ]
        },
    )
    model = _model(root, namespace)
    [found] = telemetry.metrics(model.push, _api(model))
    assert found.client.disabled
    assert not found.server.disabled
    assert [(o.name, o.disabled) for o in found.server.overrides] == [("REQUEST_SIZE", True)]


def test_providers_replace_the_parents_and_unknown_ones_are_dropped() -> None:
    namespace = _telemetry(
        "ns", "default", {"metrics": [{"providers": [{"name": "other-prom"}, {"name": "missing"}]}]}
    )
    model = _model(namespace)
    assert [p.provider.name for p in telemetry.metrics(model.push, _api(model))] == ["other-prom"]
    assert telemetry.undefined_providers(model.push, _api(model)) == (("metrics", "missing"),)


def test_undefined_providers_of_every_field_are_listed_and_names_match_case_insensitively() -> None:
    spec = {
        "metrics": [{"providers": [{"name": "OTHER-PROM"}]}],
        "accessLogging": [{"providers": [{"name": "file-log"}, {"name": "no-log"}]}],
        "tracing": [{"providers": [{"name": "no-trace"}]}],
    }
    model = _model(
        _telemetry("ns", "default", spec),
        mesh=MESH.replace("{metrics: [prometheus]}", "{metrics: [prometheus], accessLogging: [no-default]}"),
    )
    assert telemetry.undefined_providers(model.push, _api(model)) == (
        ("accessLogging", "no-default"),
        ("accessLogging", "no-log"),
        ("tracing", "no-trace"),
    )
    # Outside the object's namespace only defaultProviders is in scope.
    other = model.proxy(OTHER, {"LABELS": {"app": "web"}})
    assert telemetry.undefined_providers(model.push, other) == (("accessLogging", "no-default"),)


def test_labels_and_namespaces_clients_send_add_no_resolutions() -> None:
    selecting = _telemetry("api", "default", {"selector": {"matchLabels": {"app": "api"}}, "metrics": [{}]})
    model = _model(_telemetry("ns", "default", {"metrics": [{}]}), selecting)

    def resolutions() -> int:
        return sum(
            1 for key in model.push._memo if isinstance(key, tuple) and key[0] == "telemetry-applicable"
        )

    unregistered = "sidecar~10.1.0.8~y-1.default~default.svc.cluster.local"  # its labels are its own
    for i in range(10):
        labels = {"app": "api", "pod-hash": str(i)}
        telemetry.applicable(model.push, model.proxy(unregistered, {"LABELS": labels}))
        telemetry.applicable(model.push, model.proxy(unregistered, {"LABELS": {"app": f"other-{i}"}}))
        node = f"sidecar~10.1.0.9~x-1.made-up-{i}~made-up-{i}.svc.cluster.local"
        telemetry.applicable(model.push, model.proxy(node, {"LABELS": {"app": "api"}}))
    # One for the workload the selector picks, one for the rest of default, one for other namespaces.
    assert resolutions() == 3


def test_access_logging_falls_back_to_nothing_without_telemetry_or_default_providers() -> None:
    model = _model()
    assert telemetry.access_logging(model.push, _api(model), TelemetryClass.CLIENT) == []
    assert telemetry.tracing(model.push, _api(model)) is None


def test_access_logging_by_mode_with_filter_and_disabled() -> None:
    root = _telemetry(
        "mesh",
        "istio-system",
        {
            "accessLogging": [
                {"providers": [{"name": "file-log"}], "filter": {"expression": "response.code >= 400"}}
            ]
        },
    )
    namespace = _telemetry(
        "ns", "default", {"accessLogging": [{"match": {"mode": "SERVER"}, "disabled": True}]}
    )
    model = _model(root, namespace)
    [client] = telemetry.access_logging(model.push, _api(model), TelemetryClass.CLIENT)
    assert client.provider.name == "file-log"
    assert client.filter_expression == "response.code >= 400"
    assert not client.disabled
    [server] = telemetry.access_logging(model.push, _api(model), TelemetryClass.SERVER)
    assert server.disabled


def test_tracing_from_default_provider_and_overrides() -> None:
    namespace = _telemetry(
        "ns",
        "default",
        {
            "tracing": [
                {"providers": [{"name": "zipkin"}], "randomSamplingPercentage": 25},
                {"match": {"mode": "SERVER"}, "disableSpanReporting": True},
            ]
        },
    )
    model = _model(namespace)
    found = telemetry.tracing(model.push, _api(model))
    assert found is not None
    assert found.client.provider.name == "zipkin"
    assert found.client.random_sampling_percentage == 25
    assert not found.client.disabled
    assert found.server.disabled
    assert found.client.use_request_id_for_trace_sampling and found.client.enable_istio_tags


def test_resolution_is_shared_by_proxies_of_one_namespace_and_labels() -> None:
    selected = _telemetry(
        "api",
        "default",
        {"selector": {"matchLabels": {"app": "api"}}, "metrics": [{"reportingInterval": "5s"}]},
    )
    model = _model(selected)
    first = telemetry.metrics(model.push, _api(model))
    again = telemetry.metrics(
        model.push, model.proxy(API.replace("api-1", "api-2"), {"LABELS": {"app": "api"}})
    )
    assert first is again


def test_a_telemetry_change_pushes_listeners_of_its_namespace_or_of_everyone_from_the_root() -> None:
    model = _model()
    api = _api(model)

    def request(namespace: str) -> PushRequest:
        return PushRequest(full=True, configs_updated=frozenset({ConfigKey(Kind.TELEMETRY, "t", namespace)}))

    assert proxy_needs_push(api, request("default"), "istio-system")
    assert proxy_needs_push(api, request("istio-system"), "istio-system")
    assert not proxy_needs_push(api, request("shop"), "istio-system")
    generators = sidecar_generators()
    pushed = {
        t
        for t in (TypeUrl.CLUSTER, TypeUrl.LISTENER, TypeUrl.ROUTE, TypeUrl.ENDPOINT)
        if generators[t].needs_push(request("default"))
    }
    assert pushed == {TypeUrl.LISTENER}


def test_what_applies_is_answered_once_per_proxy_state_and_anew_for_another_snapshot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def selecting(app: str) -> dict[str, Any]:
        spec = {"selector": {"matchLabels": {"app": app}}, "metrics": [{"reportingInterval": "5s"}]}
        return _telemetry("selected", "default", spec)

    worked_out: list[str] = []
    real = telemetry._applicable

    def counting(push: Any, proxy: Any) -> Any:
        worked_out.append(push.version)
        return real(push, proxy)

    monkeypatch.setattr(telemetry, "_applicable", counting)
    model = _model(selecting("api"))
    proxy = _api(model)
    key = ConfigKey(Kind.TELEMETRY, "selected", "default")
    found = telemetry.applicable(model.push, proxy)
    assert key in dict(found.fingerprint)
    assert telemetry.applicable(model.push, proxy) is found
    assert worked_out == ["test/1"]
    # The object now selects another workload. A request answered with the new snapshot before the
    # proxy's refresh reads the new snapshot's answer, not the one its state kept.
    model.env.store.upsert(decode_object(selecting("web")).obj)
    push = model.env.build_push_context("test/2")
    assert key not in dict(telemetry.applicable(push, proxy).fingerprint)
    model.env.refresh_proxy(proxy, push)
    assert key not in dict(telemetry.applicable(push, proxy).fingerprint)
    assert key not in dict(telemetry.applicable(push, proxy).fingerprint)
    assert key in dict(telemetry.applicable(model.push, proxy).fingerprint)
    # Once per state and snapshot: the old state with each snapshot, the refreshed one, the old snapshot.
    assert worked_out == ["test/1", "test/2", "test/2", "test/1"]
