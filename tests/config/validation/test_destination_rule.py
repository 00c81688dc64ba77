"""DestinationRule and traffic policy rules beyond the reference table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

DR = "DestinationRule"
FAILOVER_WARNING = "outlier detection policy must be provided for failover"

# (id, spec, errors, warnings)
CASES: list[tuple[str, str, set[str], set[str]]] = [
    ("star-host-passes", "{host: '*'}", set(), set()),
    ("short-host-passes", "{host: reviews}", set(), set()),
    (
        "subset-warnings-are-dropped",
        "{host: r, subsets: [{name: v1, trafficPolicy: {outlierDetection: {consecutiveErrors: 5}}}]}",
        set(),
        set(),
    ),
    (
        "subset-errors-are-kept",
        "{host: r, subsets: [{name: '', trafficPolicy: {}}]}",
        {"subset name cannot be empty", "traffic policy must have at least one field"},
        set(),
    ),
    (
        "port-level-settings",
        "{host: r, trafficPolicy: {portLevelSettings: [{loadBalancer: {simple: ROUND_ROBIN}}, "
        "{port: {number: 0}}]}}",
        {"portTrafficPolicy must have valid port", "port traffic policy must have at least one field"},
        set(),
    ),
    (
        "port-level-warnings-are-dropped",
        "{host: r, trafficPolicy: {portLevelSettings: [{port: {number: 80}, "
        "outlierDetection: {consecutiveErrors: 1}, loadBalancer: {localityLbSetting: "
        "{failoverPriority: [a]}}}]}}",
        set(),
        set(),
    ),
    (
        "tunnel-and-proxy-protocol",
        "{host: r, trafficPolicy: {tunnel: {targetHost: a.com, targetPort: 0}, proxyProtocol: {}, "
        "outlierDetection: {maxEjectionPercent: 500}}}",
        {"tunnel and proxyProtocol must not be set together"},
        set(),
    ),
    (
        "tunnel-target",
        "{host: r, trafficPolicy: {tunnel: {targetHost: 'a_b', targetPort: 0}}}",
        {
            'tunnel target host must be valid FQDN or IP address: domain name "a_b" invalid (label "a_b" '
            "invalid); "
            "a_b is not a valid IP",
            "tunnel target port is invalid: port number 0 must be in the range 1..65535",
        },
        set(),
    ),
    (
        "tunnel-ip-target",
        "{host: r, trafficPolicy: {tunnel: {protocol: POST, targetHost: 10.0.0.1, targetPort: 80}}}",
        set(),
        set(),
    ),
    (
        "outlier-detection",
        "{host: r, trafficPolicy: {outlierDetection: {consecutiveLocalOriginFailures: 3, interval: 0s, "
        "baseEjectionTime: 1.0001s, minHealthPercent: -1}}}",
        {
            "outlier detection consecutive local origin failures is specified, but split external local "
            "origin "
            "errors is set to false",
            "duration must be greater than 1ms",
            "only durations to ms precision are supported",
            "percentage -1 is not in range 0..100",
        },
        set(),
    ),
    (
        "connection-pool",
        "{host: r, trafficPolicy: {connectionPool: {http: {http1MaxPendingRequests: -1, "
        "http2MaxRequests: -1, "
        "maxRequestsPerConnection: -1, maxRetries: -1, maxConcurrentStreams: -1, h2UpgradePolicy: UPGRADE, "
        "useClientProtocol: true, idleTimeout: 0.5ms}, tcp: {maxConnections: -1, connectTimeout: 0s, "
        "maxConnectionDuration: 1.5ms, idleTimeout: 0s, tcpKeepalive: {time: 0s, interval: 0s}}}}}",
        {
            "http1 max pending requests must be non-negative",
            "http2 max requests must be non-negative",
            "max requests per connection must be non-negative",
            "max retries must be non-negative",
            "max concurrent streams must be non-negative",
            "use client protocol must not be true when H2UpgradePolicy is UPGRADE",
            "duration must be greater than 1ms",
            "max connections must be non-negative",
            "only durations to ms precision are supported",
        },
        set(),
    ),
    (
        # istiod 1.28 does not check http2KeepAlive (HEAD requires interval and timeout).
        "http2-keepalive-unchecked-1.28",
        "{host: r, trafficPolicy: {connectionPool: {http: {http2KeepAlive: {}}}}}",
        set(),
        set(),
    ),
    (
        "consistent-hash",
        "{host: r, trafficPolicy: {loadBalancer: {consistentHash: {httpCookie: {name: '', "
        "attributes: [{name: ''}, {name: a}, {name: a}]}, minimumRingSize: 1024, maglev: {tableSize: 0}}}}}",
        {
            "name required for HttpCookie",
            "cookie attribute name cannot be empty",
            "duplicate cookie attribute name: a",
            "only one of MinimumRingSize or Maglev/Ringhash can be specified",
            "tableSize must be set for maglev",
            "tableSize must be a prime number for maglev",
        },
        {
            "consistent hash MinimumRingSize is deprecated, use ConsistentHashLB's RingHash configuration "
            "instead"
        },
    ),
    (
        "maglev-too-large",
        "{host: r, trafficPolicy: {loadBalancer: {consistentHash: {useSourceIp: true, maglev: "
        "{tableSize: 5000011}}}}}",
        {"tableSize must be less than 5000011 for maglev"},
        set(),
    ),
    (
        "maglev-one-counts-as-prime",
        "{host: r, trafficPolicy: {loadBalancer: {consistentHash: {useSourceIp: true, maglev: "
        "{tableSize: 1}}}}}",
        set(),
        set(),
    ),
    (
        "locality-weights-range",
        "{host: r, trafficPolicy: {loadBalancer: {localityLbSetting: {distribute: [{from: a, to: {b: 0, "
        "c: 100}}]}}}}",
        {"locality weight must be in range [1, 100]"},
        set(),
    ),
    (
        "locality-weights-total",
        "{host: r, trafficPolicy: {loadBalancer: {localityLbSetting: {distribute: [{from: a, to: {b: 50, "
        "c: 40}}]}}}}",
        {"total locality weight 90 != 100"},
        set(),
    ),
    (
        "locality-wildcard-position",
        "{host: r, trafficPolicy: {loadBalancer: {localityLbSetting: {distribute: [{from: 'a/*/c', to: "
        "{b: 100}}]}}}}",
        {"locality a/*/c wildcard '*' number can not exceed 1 and must be in the end"},
        set(),
    ),
    (
        "locality-empty-part",
        "{host: r, trafficPolicy: {loadBalancer: {localityLbSetting: {distribute: [{from: 'a//c', to: "
        "{b: 100}}]}}}}",
        {"locality a//c must not contain empty region/zone/subzone info"},
        set(),
    ),
    (
        "locality-overlap",
        "{host: r, trafficPolicy: {loadBalancer: {localityLbSetting: {distribute: [{from: a, to: {b: 100}}, "
        "{from: a/z, to: {b: 100}}]}}}}",
        {"locality a/z overlap with previous specified ones"},
        set(),
    ),
    (
        "locality-failover-without-outlier",
        "{host: r, trafficPolicy: {loadBalancer: {localityLbSetting: {failover: [{from: a, to: a}, "
        "{from: a/z, to: '*'}]}}}}",
        {
            "locality lb failover settings must specify different regions",
            "locality lb failover only specify region",
            "locality lb failover region should not contain '*' wildcard",
        },
        {FAILOVER_WARNING},
    ),
    (
        "locality-failover-with-outlier",
        "{host: r, trafficPolicy: {outlierDetection: {consecutive5xxErrors: 1}, "
        "loadBalancer: {localityLbSetting: {failoverPriority: [topology.istio.io/network]}}}}",
        set(),
        set(),
    ),
    (
        "locality-failover-and-topology-priority",
        "{host: r, trafficPolicy: {loadBalancer: {localityLbSetting: {failover: [{from: a, to: b}], "
        "failoverPriority: [topology.kubernetes.io/zone]}}}}",
        {
            "can not simultaneously set 'failover' and topology label 'topology.kubernetes.io/zone' in "
            "'failover_priority'"
        },
        set(),
    ),
    (
        # istiod 1.28 does not know zoneAwareLbSetting, so it may sit next to localityLbSetting.
        "zone-aware-unchecked-1.28",
        "{host: r, trafficPolicy: {loadBalancer: {localityLbSetting: {enabled: true}, "
        "zoneAwareLbSetting: {failoverPriority: [topology.kubernetes.io/region]}}}}",
        set(),
        set(),
    ),
    (
        "warmup-1.28",
        "{host: r, trafficPolicy: {loadBalancer: {warmup: {minimumPercent: 101, aggression: 0.5}}}}",
        {
            "duration is required",
            "minimumPercent value should be less than or equal to 100",
            "aggression should be greater than or equal to 1",
        },
        set(),
    ),
    (
        "client-tls-insecure-skip-verify",
        "{host: r, trafficPolicy: {tls: {mode: SIMPLE, insecureSkipVerify: true, caCertificates: /ca.pem}, "
        "portLevelSettings: [{port: {number: 80}, tls: {mode: MUTUAL, insecureSkipVerify: true, "
        "subjectAltNames: [a], clientCertificate: /c, privateKey: /k}}]}}",
        {
            "cannot specify CaCertificates or CredentialName or SubjectAltNames when InsecureSkipVerify is "
            "set true",
            "cannot specify CaCertificates or SubjectAltNames when InsecureSkipVerify is set true",
        },
        set(),
    ),
    (
        "client-tls-credential-name",
        "{host: r, trafficPolicy: {tls: {mode: MUTUAL, credentialName: cred, caCrl: /crl}}}",
        {"cannot specify client certificates or CA certificate or CA CRL If credentialName is set"},
        set(),
    ),
    (
        "client-tls-configmap-other-namespace",
        "{host: r, trafficPolicy: {tls: {mode: SIMPLE, credentialName: 'configmap://other/ca'}}}",
        {'invalid configmap:// credentialName: namespace must match the configuration namespace "default"'},
        set(),
    ),
    (
        "client-tls-configmap-malformed",
        "{host: r, trafficPolicy: {tls: {mode: SIMPLE, credentialName: 'configmap://ca'}}}",
        {
            'invalid configmap:// credentialName: invalid resource name "configmap://ca". Expected '
            "namespace and name"
        },
        set(),
    ),
    (
        "client-tls-configmap-same-namespace",
        "{host: r, trafficPolicy: {tls: {mode: SIMPLE, credentialName: 'configmap://default/ca'}}}",
        set(),
        set(),
    ),
    (
        "proxy-protocol-version",
        {"host": "r", "trafficPolicy": {"proxyProtocol": {"version": 7}}},
        {"proxy protocol version is invalid: 7"},
        set(),
    ),
    (
        "retry-budget-is-a-field",
        "{host: r, trafficPolicy: {retryBudget: {minRetryConcurrency: 2}}}",
        set(),
        set(),
    ),
    (
        "selector-without-labels",
        "{host: r, workloadSelector: {}, exportTo: [default]}",
        set(),
        {"workload selector specified without labels"},
    ),
    (
        "selector-labels",
        "{host: r, workloadSelector: {matchLabels: {'': a, b: '*'}}, exportTo: ['.', other]}",
        {
            'empty key is not supported in selector: "=a"',
            'wildcard is not supported in selector: "b=*"',
            "destination rule with workload selector cannot have multiple entries in exportTo",
        },
        set(),
    ),
]


@pytest.mark.parametrize(("spec", "errors", "warnings"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_destination_rule_rules(
    spec: Any, errors: set[str], warnings: set[str], validate: Callable[..., Any]
) -> None:
    outcome = validate(DR, spec)
    assert set(outcome.errors) == errors
    assert set(outcome.warnings) == warnings


def test_top_level_failover_warning_surfaces(validate: Callable[..., Any]) -> None:
    spec = "{host: r, trafficPolicy: {loadBalancer: {localityLbSetting: {failover: [{from: a, to: b}]}}}}"
    assert validate(DR, spec).warnings == [FAILOVER_WARNING]


def test_overlapping_target_localities(validate: Callable[..., Any]) -> None:
    # Which of the two is named depends on map order, in istiod as here.
    spec = (
        "{host: r, trafficPolicy: {loadBalancer: {localityLbSetting: "
        "{distribute: [{from: a, to: {b: 50, b/z: 50}}]}}}}"
    )
    errors = validate(DR, spec).errors
    assert len(errors) == 1
    assert errors[0] in {
        "locality b/z overlap with previous specified ones",
        "locality b overlap with previous specified ones",
    }
