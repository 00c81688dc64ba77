"""MeshConfig validation (istiod 1.28's ValidateMeshConfig)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from meshpilot._proto.istio.mesh.v1alpha1 import config_pb2
from meshpilot.config.errors import ValidationError
from meshpilot.config.protojson import parse_spec
from meshpilot.config.validation import validate_mesh_config

# What istiod's defaults look like once merged.
DEFAULT_MESH: dict[str, Any] = {
    "proxyListenPort": 15001,
    "connectTimeout": "10s",
    "protocolDetectionTimeout": "0s",
    "trustDomain": "cluster.local",
    "defaultConfig": {
        "configPath": "./etc/istio/proxy",
        "binaryPath": "/usr/local/bin/envoy",
        "serviceCluster": "istio-proxy",
        "drainDuration": "45s",
        "discoveryAddress": "istiod.istio-system.svc:15012",
        "proxyAdminPort": 15000,
        "controlPlaneAuthPolicy": "MUTUAL_TLS",
        "statusPort": 15020,
        "tracing": {"zipkin": {"address": "zipkin.istio-system:9411"}},
    },
}


def mesh(**changes: Any) -> Any:
    raw = copy.deepcopy(DEFAULT_MESH)
    for path, value in changes.items():
        target = raw
        *parents, leaf = path.split("__")
        for key in parents:
            target = target.setdefault(key, {})
        if value is None:
            target.pop(leaf, None)
        else:
            target[leaf] = value
    message = config_pb2.MeshConfig()
    parse_spec(raw, message)
    return message


def errors_of(message: Any) -> list[str]:
    with pytest.raises(ValidationError) as err:
        validate_mesh_config(message)
    return err.value.errors


def test_default_mesh_config_is_valid() -> None:
    assert validate_mesh_config(mesh()) == []


@pytest.mark.parametrize(
    ("changes", "errors"),
    [
        ({"proxyListenPort": 0}, ["invalid proxy listen port: port number 0 must be in the range 1..65535"]),
        ({"connectTimeout": "2h"}, ["invalid connect timeout: time 2h0m0s must be >1ms and <1h0m0s"]),
        ({"connectTimeout": None}, ["invalid connect timeout: duration must be greater than 1ms"]),
        (
            {"protocolDetectionTimeout": "1.5ms"},
            ["invalid protocol detection timeout: only durations to ms precision are supported"],
        ),
        ({"defaultConfig": None}, ["missing default config"]),
        (
            {
                "defaultConfig__configPath": "",
                "defaultConfig__binaryPath": "",
                "defaultConfig__serviceCluster": None,
            },
            [
                "config path must be set",
                "binary path must be set",
                "oneof service cluster or tracing service name must be specified",
            ],
        ),
        (
            {"defaultConfig__drainDuration": "1.5s"},
            ["drain time only supports durations to seconds precision"],
        ),
        (
            {"defaultConfig__drainDuration": "0s"},
            ["invalid drain duration: duration must be greater than 1ms"],
        ),
        (
            {"defaultConfig__discoveryAddress": "istiod"},
            ['invalid discovery address: unable to split "istiod": address istiod: missing port in address'],
        ),
        (
            {"defaultConfig__discoveryAddress": "bad_host:15012"},
            ['invalid discovery address: "bad_host" is not a valid hostname or an IP address'],
        ),
        (
            {"defaultConfig__tracing": {"lightstep": {"address": ""}}},
            [
                "invalid lightstep config: address is required",
                'invalid lightstep config: invalid lightstep address: unable to split "": missing port in '
                "address",
                "invalid lightstep config: access token is required",
            ],
        ),
        (
            {"defaultConfig__tracing": {"datadog": {"address": "$(HOST_IP):x"}}},
            ['invalid datadog config: port (x) is not a number: strconv.Atoi: parsing "x": invalid syntax'],
        ),
        (
            {"defaultConfig__tracing": {"zipkin": {"address": "a:1"}, "tlsSettings": {"mode": "MUTUAL"}}},
            [
                "invalid tracing TLS config: client certificate required for mutual tls",
                "invalid tracing TLS config: private key required for mutual tls",
            ],
        ),
        (
            {"defaultConfig__statsdUdpAddress": "statsd"},
            [
                'invalid statsd udp address "statsd": unable to split "statsd": address statsd: missing '
                "port in address"
            ],
        ),
        (
            {"defaultConfig__proxyAdminPort": 0, "defaultConfig__statusPort": 70000},
            [
                "invalid proxy admin port: port number 0 must be in the range 1..65535",
                "invalid status port: port number 70000 must be in the range 1..65535",
            ],
        ),
        (
            {"defaultConfig__controlPlaneAuthPolicy": "INHERIT"},
            ['invalid authentication policy: unrecognized control plane auth policy "INHERIT"'],
        ),
        (
            {"defaultConfig__privateKeyProvider": {"cryptomb": {"pollDelay": "0s"}}},
            ["invalid private key provider configuration: pollDelay must be non zero"],
        ),
        (
            {"defaultConfig__privateKeyProvider": {}},
            [
                "invalid private key provider configuration: private key provider configuration is required",
                "invalid private key provider configuration: unknown private key provider",
            ],
        ),
        (
            {
                "localityLbSetting": {
                    "distribute": [{"from": "a", "to": {"b": 100}}],
                    "failover": [{"from": "a", "to": "b"}],
                }
            },
            ["can not simultaneously specify 'distribute' and 'failover'"],
        ),
        (
            {"serviceSettings": [{"hosts": ["ok.com"]}, {"hosts": ["b_d.com"]}]},
            ['serviceSettings[1], host `b_d.com`: domain name "b_d.com" invalid (label "b_d" invalid)'],
        ),
        ({"trustDomain": ""}, ["trustDomain: empty domain name not allowed"]),
        (
            {"trustDomainAliases": ["td.local", "bad_td"]},
            ['trustDomainAliases[1], domain `bad_td` : trust domain name "bad_td" invalid'],
        ),
        ({"meshMTLS": {"ecdhCurves": ["P-256"]}}, ["mesh TLS does not support ECDH curves configuration"]),
    ],
)
def test_mesh_config_errors(changes: dict[str, Any], errors: list[str]) -> None:
    assert sorted(errors_of(mesh(**changes))) == sorted(errors)


def test_mesh_config_warnings() -> None:
    message = mesh(
        tlsDefaults={"ecdhCurves": ["P-256", "P-256", "B-163", "X25519"]},
        localityLbSetting={"failover": [{"from": "a", "to": "b"}]},
        defaultConfig__proxyMetadata={"ISTIO_META_DNS_AUTO_ALLOCATE": "true"},
    )
    assert sorted(validate_mesh_config(message)) == sorted(
        [
            "detected unrecognized ECDH curves: [B-163]",
            "detected duplicate ECDH curves: [P-256]",
            "'ISTIO_META_DNS_AUTO_ALLOCATE' is deprecated; review "
            "https://istio.io/latest/docs/ops/configuration/"
            "traffic-management/dns-proxy/#dns-auto-allocation-v2 for information about replacement "
            "functionality",
        ]
    )


def test_tracing_service_name_instead_of_cluster() -> None:
    message = mesh(
        defaultConfig__serviceCluster=None, defaultConfig__tracingServiceName="CANONICAL_NAME_ONLY"
    )
    assert validate_mesh_config(message) == []
