"""MeshConfig ext_authz providers resolved as istiod resolves them: filter configs, or errors."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from google.protobuf import json_format
from support.kube import istio, workload
from support.mesh_objects import mesh_objects
from support.model import build

from meshpilot.model.mesh import MeshConfig
from meshpilot.networking import ext_authz
from meshpilot.networking.ext_authz import ExtAuthzProvider

AUTHZ = workload("ext-authz", "default", "10.96.0.90", 8000, {"ext-authz-0": "10.1.0.90"}, port_name="http")
GRPC_AUTHZ = workload("authz", "auth", "10.96.0.91", 9000, {"authz-0": "10.1.0.91"}, port_name="grpc")


def resolved(mesh_yaml: str, *docs: dict[str, Any]) -> ext_authz.ExtAuthzProviders:
    model = build([*mesh_objects(), *AUTHZ, *GRPC_AUTHZ, *docs], mesh_yaml)
    return ext_authz.providers(model.push)


def usable(providers: ext_authz.ExtAuthzProviders, name: str) -> ExtAuthzProvider:
    found = providers.find(name)
    assert isinstance(found, ExtAuthzProvider), found
    return found


def as_dict(message: Any) -> Any:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


HTTP_FULL = """
extensionProviders:
- name: http-authz
  envoyExtAuthzHttp:
    service: ext-authz.default.svc.cluster.local
    port: 8000
    timeout: 2s
    pathPrefix: /check
    failOpen: true
    statusOnError: "503"
    includeRequestHeadersInCheck: [x-ext-authz, "x-trace-*"]
    includeHeadersInCheck: [ignored-when-the-new-field-is-set]
    includeAdditionalHeadersInCheck: {x-b: "2", x-a: "1"}
    headersToUpstreamOnAllow: [x-user, "*-id"]
    headersToDownstreamOnDeny: [x-result]
    includeRequestBodyInCheck: {maxRequestBytes: 4096, packAsBytes: true}
"""


def test_http_provider_with_every_option() -> None:
    provider = usable(resolved(HTTP_FULL), "http-authz")
    assert provider.tcp is None, "an HTTP provider cannot check TCP connections"

    def ignore_case(kind: str, value: str) -> dict[str, Any]:
        return {kind: value, "ignore_case": True}

    assert as_dict(provider.http) == {
        "http_service": {
            "server_uri": {
                "uri": "http://ext-authz.default.svc.cluster.local",
                "cluster": "outbound|8000||ext-authz.default.svc.cluster.local",
                "timeout": "2s",
            },
            "path_prefix": "/check",
            "authorization_request": {
                "headers_to_add": [{"key": "x-a", "value": "1"}, {"key": "x-b", "value": "2"}]
            },
            "authorization_response": {
                "allowed_upstream_headers": {
                    "patterns": [ignore_case("exact", "x-user"), ignore_case("suffix", "-id")]
                },
                "allowed_client_headers": {"patterns": [ignore_case("exact", "x-result")]},
            },
        },
        "failure_mode_allow": True,
        "status_on_error": {"code": "ServiceUnavailable"},
        "allowed_headers": {
            "patterns": [ignore_case("exact", "x-ext-authz"), ignore_case("prefix", "x-trace-")]
        },
        "with_request_body": {"max_request_bytes": 4096, "pack_as_bytes": True},
        "transport_api_version": "V3",
    }


def test_deprecated_include_headers_in_check_counts_alone() -> None:
    mesh = """
extensionProviders:
- name: a
  envoyExtAuthzHttp:
    {service: ext-authz.default.svc.cluster.local, port: 8000, includeHeadersInCheck: [x-old]}
"""
    provider = usable(resolved(mesh), "a")
    assert as_dict(provider.http)["allowed_headers"] == {
        "patterns": [{"exact": "x-old", "ignore_case": True}]
    }
    # istiod's 600s when no timeout is set; no response section without response headers.
    assert as_dict(provider.http)["http_service"]["server_uri"]["timeout"] == "600s"
    assert "authorization_response" not in as_dict(provider.http)["http_service"]


def test_grpc_provider_makes_http_and_network_filters() -> None:
    mesh = """
extensionProviders:
- name: grpc-authz
  envoyExtAuthzGrpc: {service: auth/authz.auth.svc.cluster.local, port: 9000, timeout: 0.5s, failOpen: true}
"""
    provider = usable(resolved(mesh), "grpc-authz")
    grpc = {
        "envoy_grpc": {
            "cluster_name": "outbound|9000||authz.auth.svc.cluster.local",
            "authority": "authz.auth.svc.cluster.local",
        },
        "timeout": "0.500s",
    }
    assert as_dict(provider.http) == {
        "grpc_service": grpc,
        "failure_mode_allow": True,
        "transport_api_version": "V3",
    }
    assert as_dict(provider.tcp) == {
        "stat_prefix": "tcp.",
        "grpc_service": grpc,
        "failure_mode_allow": True,
        "transport_api_version": "V3",
    }


def test_providers_of_other_kinds_are_not_ext_authz_providers() -> None:
    found = resolved("{}").find("prometheus")
    assert found == "available providers are [] but found 'prometheus'"


HOST = "ext-authz.default.svc.cluster.local"


@pytest.mark.parametrize(
    ("provider", "error"),
    [
        ({"name": "Upper", "envoyExtAuthzHttp": {"service": HOST, "port": 8000}}, "lowercase"),
        ({"name": "-a", "envoyExtAuthzHttp": {"service": HOST, "port": 8000}}, "hyphen"),
        ({"name": "a", "envoyExtAuthzHttp": {"service": HOST}}, "must be in the range 1..65535"),
        ({"name": "a", "envoyExtAuthzHttp": {"port": 80}}, "service must not be empty"),
        ({"name": "a", "envoyExtAuthzHttp": {"service": "no_such!", "port": 80}}, "invalid service fmt"),
        (
            {"name": "a", "envoyExtAuthzHttp": {"service": "nowhere.default", "port": 80}},
            "could not find service",
        ),
        (
            {
                "name": "a",
                "envoyExtAuthzGrpc": {"service": "auth/ext-authz.default.svc.cluster.local", "port": 80},
            },
            "could not find",
        ),
        (
            {"name": "a", "envoyExtAuthzHttp": {"service": HOST, "port": 80, "statusOnError": "999"}},
            "unsupported statusOnError",
        ),
        (
            {"name": "a", "envoyExtAuthzHttp": {"service": HOST, "port": 80, "statusOnError": "5x"}},
            "invalid statusOnError",
        ),
        (
            {"name": "a", "envoyExtAuthzHttp": {"service": HOST, "port": 80, "pathPrefix": "check"}},
            "must begin with `/`",
        ),
        (
            {"name": "a", "envoyExtAuthzHttp": {"service": HOST, "port": 80, "pathPrefix": "/%zz"}},
            "invalid pathPrefix",
        ),
        (
            {
                "name": "a",
                "envoyExtAuthzHttp": {"service": HOST, "port": 80, "headersToUpstreamOnAllow": ["*"]},
            },
            "single wildcard",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_an_unusable_provider_keeps_its_errors(provider: dict[str, Any], error: str) -> None:
    providers = resolved(yaml.safe_dump({"extensionProviders": [provider]}))
    found = providers.find(provider["name"])
    assert isinstance(found, str) and error in found, found


def test_a_duplicate_name_makes_the_provider_unusable() -> None:
    """MeshConfig loading merges providers by name (as istiod's does), so only a MeshConfig made
    another way can hold two of one name: the later one is kept, with the error."""
    push = build([*mesh_objects(), *AUTHZ]).push
    configs = [
        MeshConfig.ExtensionProvider(name="a", envoy_ext_authz_http={"service": HOST, "port": port})
        for port in (8000, 8001)
    ]
    found = ext_authz.resolve(configs, push).find("a")
    assert isinstance(found, str) and "must be unique, found duplicate: a" in found


def test_a_host_in_two_namespaces_needs_its_namespace() -> None:
    entry = {
        "hosts": ["authz.example.com"],
        "location": "MESH_EXTERNAL",
        "resolution": "DNS",
        "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
    }
    docs = [istio("ServiceEntry", "authz", ns, entry) for ns in ("default", "other")]
    mesh = """
extensionProviders:
- {name: short, envoyExtAuthzHttp: {service: authz.example.com, port: 80}}
- {name: named, envoyExtAuthzHttp: {service: other/authz.example.com, port: 80}}
"""
    providers = resolved(mesh, *docs)
    short = providers.find("short")
    assert isinstance(short, str) and "multiple namespaces ['default', 'other']" in short
    named = usable(providers, "named")
    assert as_dict(named.http)["http_service"]["server_uri"]["cluster"] == "outbound|80||authz.example.com"


def test_the_key_follows_the_service_lookup() -> None:
    provider = "{name: a, envoyExtAuthzHttp: {service: late.default.svc.cluster.local, port: 80}}"
    mesh = f"extensionProviders: [{provider}]"
    before = ext_authz.providers(build([*mesh_objects()], mesh).push)
    late = workload("late", "default", "10.96.0.99", 80, {"late-0": "10.1.0.99"}, port_name="http")
    after = ext_authz.providers(build([*mesh_objects(), *late], mesh).push)
    assert isinstance(before.find("a"), str)
    assert isinstance(after.find("a"), ExtAuthzProvider)
    assert before.key != after.key
