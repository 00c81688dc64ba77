"""Which proxies a push request concerns, and what of that answer is worked out once per request."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
from support.kube import istio, workload
from support.model import Model, build

from meshpilot.model.config import ConfigKey
from meshpilot.model.kind import Kind
from meshpilot.model.push_request import PushRequest, TriggerReason
from meshpilot.model.sidecar_scope import SidecarScope
from meshpilot.xds.dependencies import proxy_needs_push
from meshpilot.xds.generators.base import memoized_by_identity

ROOT = "istio-system"
API = "sidecar~10.1.0.51~api-0.default~default.svc.cluster.local"
WEB = "sidecar~10.1.0.52~web-0.default~default.svc.cluster.local"
# Sees only its own namespace (a Sidecar resource), so not api.default.
LONER = "sidecar~10.1.0.61~loner-0.other~other.svc.cluster.local"
GATEWAY = "router~10.1.0.71~gw-0.istio-system~istio-system.svc.cluster.local"


@pytest.fixture(scope="module")
def model() -> Model:
    return build(
        [
            *workload("api", "default", "10.96.0.50", 9080, {"api-0": "10.1.0.51"}),
            *workload("web", "default", "10.96.0.55", 8080, {"web-0": "10.1.0.52"}),
            *workload("db", "default", "10.96.0.57", 5432, {"db-0": "10.1.0.53"}),
            *workload("loner", "other", "10.96.0.60", 8080, {"loner-0": "10.1.0.61"}),
            istio("Sidecar", "default", "other", {"egress": [{"hosts": ["./*"]}]}),
        ]
    )


def change(*keys: tuple[Kind, str, str], full: bool = True) -> PushRequest:
    return PushRequest(
        full=full,
        configs_updated=frozenset(ConfigKey(kind, name, ns) for kind, name, ns in keys),
        reasons=Counter({TriggerReason.CONFIG: 1}),
    )


API_ENDPOINTS = (Kind.SERVICE_ENTRY, "api.default.svc.cluster.local", "default")
A_GATEWAY = (Kind.GATEWAY, "public", "istio-system")
#: A service web and api see and neither serves: only their scope says whether it concerns them.
DB = (Kind.SERVICE_ENTRY, "db.default.svc.cluster.local", "default")


def test_a_service_concerns_those_that_see_it_or_serve_it(model: Model) -> None:
    request = change(API_ENDPOINTS, full=False)
    assert proxy_needs_push(model.proxy(WEB), request, ROOT), "web's scope holds api"
    assert proxy_needs_push(model.proxy(API), request, ROOT), "api serves it"
    assert not proxy_needs_push(model.proxy(LONER), request, ROOT), "outside loner's Sidecar"


def test_gateways_concern_routers_never_sidecars(model: Model) -> None:
    assert not proxy_needs_push(model.proxy(WEB), change(A_GATEWAY), ROOT)
    assert proxy_needs_push(
        model.proxy(GATEWAY, {"LABELS": {"istio": "ingressgateway"}}), change(A_GATEWAY), ROOT
    )
    # With another change the sidecar may be concerned by that one, not by the Gateway.
    assert proxy_needs_push(model.proxy(WEB), change(A_GATEWAY, API_ENDPOINTS), ROOT)
    assert not proxy_needs_push(model.proxy(LONER), change(A_GATEWAY, API_ENDPOINTS), ROOT)


def test_secrets_forced_and_unnamed_pushes_concern_everyone(model: Model) -> None:
    loner = model.proxy(LONER)
    assert proxy_needs_push(loner, change((Kind.SECRET, "cert", "default")), ROOT)
    assert proxy_needs_push(loner, PushRequest(full=True), ROOT)
    forced = change(API_ENDPOINTS)
    forced.forced = True
    assert proxy_needs_push(loner, forced, ROOT)


def test_a_proxy_without_a_scope_is_concerned_by_all_but_gateways(model: Model) -> None:
    web = model.proxy(WEB)
    web.state = dataclasses.replace(web.state, sidecar_scope=None)
    assert proxy_needs_push(web, change((Kind.DESTINATION_RULE, "x", "elsewhere")), ROOT)
    assert not proxy_needs_push(web, change(A_GATEWAY), ROOT)


def test_a_scope_is_asked_once_per_request(model: Model, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[SidecarScope] = []
    original = SidecarScope.depends_on

    def counting(self: SidecarScope, key: ConfigKey, root: str) -> bool:
        asked.append(self)
        return original(self, key, root)

    monkeypatch.setattr(SidecarScope, "depends_on", counting)
    web, api = model.proxy(WEB), model.proxy(API)
    assert web.sidecar_scope is api.sidecar_scope, "one scope for the namespace"
    request = change(DB)
    answers = [proxy_needs_push(p, request, ROOT) for p in (web, api, web)]
    assert answers == [True, True, True]
    assert len(asked) == 1
    # Another request asks again: nothing carries over from one push to the next.
    assert proxy_needs_push(web, change(DB), ROOT)
    assert len(asked) == 2


def test_the_root_namespace_is_part_of_a_scopes_answer(model: Model) -> None:
    web = model.proxy(WEB)
    # A PeerAuthentication in the root namespace concerns every proxy; elsewhere, only those near it.
    request = change((Kind.PEER_AUTHENTICATION, "default", "istio-system"))
    assert proxy_needs_push(web, request, "istio-system")
    assert not proxy_needs_push(web, request, "mesh-root"), "the same request under another root"


def test_a_copy_of_a_request_works_its_answers_out_again() -> None:
    request = change(API_ENDPOINTS)
    assert request.updated_kinds == {Kind.SERVICE_ENTRY}
    request.memoized(("k",), lambda: "first")
    copy = dataclasses.replace(request, configs_updated=frozenset({ConfigKey(Kind.GATEWAY, "g", "ns")}))
    assert copy.updated_kinds == {Kind.GATEWAY}
    assert copy.memoized(("k",), lambda: "copy") == "copy"


def test_the_request_memo_tells_objects_apart_by_identity() -> None:
    request = PushRequest()
    first, second = [1], [1]

    def memo(obj: list[int], value: str) -> str:
        found: str = memoized_by_identity(request.memoized, ("t", id(obj)), (obj,), lambda: value)
        return found

    assert memo(first, "first") == "first"
    assert memo(second, "second") == "second", "equal, not the same"
    assert memo(first, "again") == "first"
    assert request.updated_kinds == frozenset()
    assert change(API_ENDPOINTS, A_GATEWAY).updated_kinds == {Kind.SERVICE_ENTRY, Kind.GATEWAY}
