"""ServiceEntry and WorkloadEntry rules beyond the reference table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

SE, WE = "ServiceEntry", "WorkloadEntry"
HTTP = "{number: 80, name: http, protocol: HTTP}"
NO_ADDRESS_WARNING = (
    "addresses are required for ports serving TCP (or unset) protocol when IP Autoallocation is not enabled"
)

SERVICE_ENTRY_CASES: list[tuple[str, str, set[str], set[str]]] = [
    (
        "tcp-port-without-address-and-no-autoallocation",
        "{hosts: [a.com], resolution: NONE, ports: [{number: 9000, name: tcp, protocol: TCP}, "
        "{number: 9001, name: sniffed}, {number: 9002, name: lower, protocol: tcp}]}",
        set(),
        {NO_ADDRESS_WARNING},
    ),
    (
        "dns-round-robin-endpoints",
        f"{{hosts: [a.com], resolution: DNS_ROUND_ROBIN, ports: [{HTTP}], endpoints: [{{address: a.com}}, "
        "{address: b.com}]}",
        {"there must only be 0 or 1 endpoint for resolution mode DNS_ROUND_ROBIN"},
        set(),
    ),
    (
        "dns-endpoints",
        f"{{hosts: [a.com], resolution: DNS, ports: [{HTTP}], endpoints: [{{address: 'b_c.com', "
        "ports: {grpc: 8080, Bad_Name: 0}, labels: {'a b': c}}, {address: ''}]}",
        {
            'endpoint address "b_c.com" is not a valid FQDN or an IP address',
            'endpoint address "" is not a valid FQDN or an IP address',
            "endpoint port 8080 is not defined by the service entry",
            "endpoint port 0 is not defined by the service entry",
            "invalid port name: Bad_Name",
            "port number 0 must be in the range 1..65535",
            'invalid tag key: "a b"',
        },
        set(),
    ),
    (
        "dns-wildcard-with-endpoints-is-fine",
        f"{{hosts: ['*.a.com'], resolution: DNS, ports: [{HTTP}], endpoints: [{{address: 1.2.3.4}}]}}",
        set(),
        set(),
    ),
    (
        "dns-first-bad-host-only",
        f"{{hosts: ['*.a.com', '*.b.com'], resolution: DNS, ports: [{HTTP}]}}",
        {
            "hosts must be FQDN or contain only prefix wildcards if no endpoints are provided for "
            "resolution mode "
            'DNS, domain name "*.a.com" invalid (label "*" invalid)'
        },
        set(),
    ),
    (
        "dns-address-with-several-hosts-and-tcp",
        "{hosts: [a.com, b.com], addresses: [10.0.0.1], resolution: DNS, "
        "ports: [{number: 443, name: tls, protocol: TLS}]}",
        set(),
        {"service entry can not have more than one host specified simultaneously with address and tcp port"},
    ),
    (
        "static-endpoints",
        f"{{hosts: [a.com], resolution: STATIC, ports: [{HTTP}, {{number: 81, name: admin, "
        f"protocol: HTTP}}], "
        "endpoints: [{address: 'unix:///a.sock'}, {address: 1.2.3.4, ports: {other: 9090}}, {network: n1}]}",
        {
            "exactly 1 service port required for unix endpoints",
            "endpoint port 9090 is not defined by the service entry",
        },
        {'address is unset with network "n1"'},
    ),
    (
        "static-endpoint-needs-address",
        f"{{hosts: [a.com], resolution: STATIC, ports: [{HTTP}], endpoints: [{{}}]}}",
        {"address is required"},
        set(),
    ),
    (
        # istiod 1.28's DYNAMIC_DNS: HTTP only, and only MESH_EXTERNAL.
        "dynamic-dns-1.28",
        "{hosts: [a.com, '*.b.com'], addresses: [10.0.0.1], resolution: DYNAMIC_DNS, "
        "location: MESH_INTERNAL, "
        "ports: [{number: 443, name: tls, protocol: TLS}], endpoints: [{address: 1.2.3.4}]}",
        {
            "host must be wildcarded for resolution mode DYNAMIC_DNS",
            "addresses cannot be set for resolution type DYNAMIC_DNS. HTTP route domains will only be "
            "generatedfrom the hosts field values",
            "endpoints cannot be set for resolution type DYNAMIC_DNS. Destination IP address determined from "
            "hostsfield values",
            "only HTTP protocol is supported for resolution type DYNAMIC_DNS",
            "location must be MESH_EXTERNAL for resolution type DYNAMIC_DNS",
        },
        set(),
    ),
    (
        "dynamic-dns-partial-wildcards-allowed",
        f"{{hosts: ['*foo.com'], resolution: DYNAMIC_DNS, ports: [{HTTP}]}}",
        set(),
        set(),
    ),
    (
        "selector-and-endpoints",
        f"{{hosts: [a.com], resolution: STATIC, ports: [{HTTP}], workloadSelector: {{labels: {{app: a}}}}, "
        "endpoints: [{address: 1.2.3.4}]}",
        {"only one of WorkloadSelector or Endpoints is allowed in Service Entry"},
        set(),
    ),
    (
        "selector-without-labels",
        f"{{hosts: [a.com], resolution: NONE, addresses: [10.0.0.0/8], ports: [{HTTP}], "
        f"workloadSelector: {{}}}}",
        set(),
        {
            "service entry: workload selector specified without labels, will be applied to all services in "
            "namespace",
            "workloadSelector should not be set when resolution mode is NONE",
        },
    ),
    (
        "ports",
        "{hosts: [a.com], resolution: DNS, ports: [{number: 80, name: http, protocol: HTTP, "
        "targetPort: 70000}, "
        "{number: 81, name: http, protocol: HTTP}, {number: 0, name: zero, protocol: HTTP}]}",
        {
            "port number 70000 must be in the range 1..65535",
            'service entry port name "http" already defined',
            "port number 0 must be in the range 1..65535",
        },
        set(),
    ),
    (
        "addresses",
        "{hosts: [a.com], resolution: STATIC, addresses: [10.0.0.0/8, 'bad', '1.2.3.4/99'], "
        "ports: [{number: 80, "
        "name: http, protocol: HTTP}]}",
        {"bad is not a valid IP", "1.2.3.4/99 is not a valid CIDR block"},
        set(),
    ),
    (
        "several-hosts-with-sniffed-port",
        "{hosts: [a.com, b.com], resolution: DNS, ports: [{number: 80, name: http, protocol: HTTP}, "
        "{number: 81, name: sniffed}]}",
        {"multiple hosts provided with non-HTTP, non-TLS ports"},
        set(),
    ),
    (
        "unknown-resolution-number",
        {"hosts": ["a.com"], "resolution": 9},
        {"unsupported resolution type "},
        set(),
    ),
    (
        "export-to-none-and-more",
        "{hosts: [a.com], exportTo: ['~', '.']}",
        {"cannot export service entry to no one (~) and someone"},
        set(),
    ),
]


@pytest.mark.parametrize(
    ("spec", "errors", "warnings"),
    [c[1:] for c in SERVICE_ENTRY_CASES],
    ids=[c[0] for c in SERVICE_ENTRY_CASES],
)
def test_service_entry_rules(
    spec: Any, errors: set[str], warnings: set[str], validate: Callable[..., Any]
) -> None:
    outcome = validate(SE, spec)
    assert set(outcome.errors) == errors
    assert set(outcome.warnings) == warnings


def test_autoallocation_opt_out_label(validate: Callable[..., Any]) -> None:
    spec = "{hosts: [a.com], resolution: DNS, ports: [{number: 9000, name: tcp, protocol: TCP}]}"
    assert validate(SE, spec).warnings == []
    opted_out = validate(SE, spec, labels={"networking.istio.io/enable-autoallocate-ip": "False"})
    assert opted_out.warnings == [NO_ADDRESS_WARNING]


def test_autoallocation_feature_flag(validate: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    spec = "{hosts: [a.com], resolution: DNS, ports: [{number: 9000, name: tcp, protocol: TCP}]}"
    monkeypatch.setenv("PILOT_ENABLE_IP_AUTOALLOCATE", "false")
    assert validate(SE, spec).warnings == [NO_ADDRESS_WARNING]


def test_selector_errors_stop_validation(validate: Callable[..., Any]) -> None:
    outcome = validate(SE, "{hosts: ['*'], workloadSelector: {labels: {'a*': b}}}")
    assert outcome.errors == ['wildcard is not supported in selector: "a*=b"']


WORKLOAD_ENTRY_CASES: list[tuple[str, str, set[str], set[str]]] = [
    ("unix-relative", "{address: 'unix://sock'}", {"sock is not an absolute path to a file"}, set()),
    (
        "ports-and-labels",
        "{address: a.example.com, ports: {Bad_Name: 80, ok: 0}, labels: {app: 'x y'}}",
        {
            "invalid port name: Bad_Name",
            "port number 0 must be in the range 1..65535",
            'invalid tag value: "x y"',
        },
        set(),
    ),
    ("single-label-host", "{address: vm1}", set(), set()),
    (
        "numeric-tld",
        "{address: 1.2.3.400}",
        {'endpoint address "1.2.3.400" is not a valid FQDN or an IP address'},
        set(),
    ),
    (
        "network-only-with-ports",
        "{network: n1, ports: {http: 80}}",
        set(),
        {'address is unset with network "n1"'},
    ),
]


@pytest.mark.parametrize(
    ("spec", "errors", "warnings"),
    [c[1:] for c in WORKLOAD_ENTRY_CASES],
    ids=[c[0] for c in WORKLOAD_ENTRY_CASES],
)
def test_workload_entry_rules(
    spec: Any, errors: set[str], warnings: set[str], validate: Callable[..., Any]
) -> None:
    outcome = validate(WE, spec)
    assert set(outcome.errors) == errors
    assert set(outcome.warnings) == warnings
