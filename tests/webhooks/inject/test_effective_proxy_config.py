"""The effective proxy config (istiod's EffectiveProxyConfig: defaults, the mesh's ``defaultConfig``,
the pod's ``proxy.istio.io/config``), what PROXY_CONFIG keeps of it, and the webhook reading the
server's current mesh for every pod."""

from __future__ import annotations

import base64
import json
from typing import Any

import jsonpatch
import pytest

from meshpilot.model.mesh import apply_mesh_config
from meshpilot.webhooks.inject.config import InjectConfig, InjectionError, parse_config
from meshpilot.webhooks.inject.context import clean_proxy_config, effective_proxy_config
from meshpilot.webhooks.inject.inject import inject_pod
from meshpilot.webhooks.inject.review import InjectionHandler


def _pod(annotation: str | None = None) -> dict[str, Any]:
    annotations = {"proxy.istio.io/config": annotation} if annotation is not None else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default", "labels": {"app": "a"}, "annotations": annotations},
        "spec": {"containers": [{"name": "app", "image": "app:1"}]},
    }


def _proxy_config_env(pod: dict[str, Any]) -> dict[str, Any]:
    proxy = next(c for c in pod["spec"]["containers"] if c["name"] == "istio-proxy")
    text = next(e["value"] for e in proxy["env"] if e["name"] == "PROXY_CONFIG")
    data: dict[str, Any] = json.loads(text)
    return data


def test_without_mesh_or_annotation_it_is_istiods_defaults_and_cleans_to_nothing() -> None:
    effective = effective_proxy_config(_pod())
    assert effective["discoveryAddress"] == "istiod.istio-system.svc:15012"
    assert effective["statusPort"] == 15020 and effective["drainDuration"] == "45s"
    assert clean_proxy_config(effective) == {}


def test_layers_replace_fields_whole_but_unite_proxy_metadata_and_keep_unset_headers() -> None:
    mesh = apply_mesh_config(
        "defaultConfig:\n"
        "  discoveryAddress: istiod.mesh.svc:15012\n"
        "  tracing: {sampling: 5, zipkin: {address: z:9411}}\n"
        "  proxyMetadata: {A: mesh, B: mesh}\n"
        "  proxyHeaders: {server: {disabled: true}, requestId: {disabled: true}}\n"
    )
    pod = _pod(
        "tracing: {zipkin: {address: pod:9411}}\n"
        "proxyMetadata: {B: pod, C: pod}\n"
        "proxyHeaders: {attemptCount: {disabled: true}, server: {value: pod}}\n"
    )
    effective = effective_proxy_config(pod, mesh)
    assert effective["discoveryAddress"] == "istiod.mesh.svc:15012"
    assert effective["tracing"] == {"zipkin": {"address": "pod:9411"}}  # the mesh's sampling is gone
    assert effective["proxyMetadata"] == {"A": "mesh", "B": "pod", "C": "pod"}
    assert effective["proxyHeaders"] == {
        "requestId": {"disabled": True},
        "server": {"value": "pod"},
        "attemptCount": {"disabled": True},
    }
    # Kept: only what differs from istiod's defaults, in the proto's declaration order.
    assert list(clean_proxy_config(effective)) == [
        "discoveryAddress",
        "tracing",
        "proxyMetadata",
        "proxyHeaders",
    ]


def test_an_annotation_zero_value_does_not_override_the_mesh() -> None:
    """mergeWithPrecedence feeds each layer through its protojson, where a zero scalar is absent."""
    mesh = apply_mesh_config("defaultConfig:\n  interceptionMode: TPROXY\n")
    assert effective_proxy_config(_pod("interceptionMode: REDIRECT"), mesh)["interceptionMode"] == "TPROXY"


def test_the_mesh_reaches_the_template_as_dot_proxy_config_and_proto_to_json_is_cleaned() -> None:
    template = (
        "metadata:\n  annotations:\n"
        "    hold: '{{ .ProxyConfig.HoldApplicationUntilProxyStarts.GetValue }}'\n"
        "    port: '{{ .ProxyConfig.StatusPort }}'\n"
        "    json: '{{ protoToJSON .ProxyConfig }}'\n"
    )
    config = parse_config(json.dumps({"templates": {"sidecar": template}}))
    mesh = apply_mesh_config("defaultConfig:\n  holdApplicationUntilProxyStarts: true\n")
    injected = inject_pod(_pod(), "default", config, mesh=mesh)
    assert injected is not None
    annotations = injected["metadata"]["annotations"]
    assert annotations["hold"] == "true"
    assert annotations["port"] == "15020"
    assert annotations["json"] == '{"holdApplicationUntilProxyStarts":true}'


def test_the_handler_reads_the_current_mesh_for_each_pod() -> None:
    meshes = [apply_mesh_config(""), apply_mesh_config("defaultConfig:\n  proxyMetadata: {LIVE: 'yes'}\n")]
    current = {"mesh": meshes[0]}
    handler = InjectionHandler(InjectConfig(), mesh=lambda: current["mesh"])

    def inject() -> dict[str, Any]:
        pod = _pod()
        response = handler({"uid": "u", "namespace": "default", "object": pod})
        patched: dict[str, Any] = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(response["patch"])))
        return patched

    assert _proxy_config_env(inject()) == {}
    current["mesh"] = meshes[1]
    assert _proxy_config_env(inject()) == {"proxyMetadata": {"LIVE": "yes"}}


def test_a_bad_annotation_still_fails_the_injection_whatever_the_mesh() -> None:
    mesh = apply_mesh_config("defaultConfig:\n  concurrency: 2\n")
    with pytest.raises(InjectionError, match=r"proxy\.istio\.io/config"):
        inject_pod(_pod("concurrency: many"), "default", InjectConfig(), mesh=mesh)


def test_image_type_from_the_proxy_config_then_variant_with_the_annotation_over_both() -> None:
    config = parse_config("{}", "global:\n  tag: 1.28.0-debug\n  variant: distroless\n")
    mesh = apply_mesh_config("defaultConfig:\n  image: {imageType: default}\n")

    def images(pod: dict[str, Any], mesh: Any) -> list[str]:
        injected = inject_pod(pod, "default", config, mesh=mesh)
        assert injected is not None
        return [c["image"] for c in injected["spec"]["initContainers"] + injected["spec"]["containers"][1:]]

    assert images(_pod(), None) == ["docker.io/istio/proxyv2:1.28.0-distroless"] * 2
    assert images(_pod(), mesh) == [
        "docker.io/istio/proxyv2:1.28.0-distroless",
        "docker.io/istio/proxyv2:1.28.0",
    ]
    pod = _pod()
    pod["metadata"]["annotations"]["sidecar.istio.io/proxyImageType"] = "debug"
    assert images(pod, mesh) == ["docker.io/istio/proxyv2:1.28.0-debug"] * 2
