"""Gateway and Sidecar rules beyond the reference table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

GW, SC = "Gateway", "Sidecar"
HTTPS = "{number: 443, name: https, protocol: HTTPS}"

GATEWAY_CASES: list[tuple[str, str, set[str], set[str]]] = [
    (
        "hosts",
        "{servers: [{port: {number: 80, name: http, protocol: HTTP}, "
        "hosts: [10.0.0.1, 'ns/*', '*/foo.com', 'Bad_ns/foo.com', 'ns/foo', '~/foo.com', 'ns/', "
        "'fo_o.com']}]}",
        {
            'invalid namespace value "Bad_ns" in gateway',
            "short names (non FQDN) are not allowed",
            'invalid namespace value "~" in gateway',
            "config namespace and dnsName in host entry cannot be empty",
            "empty domain name not allowed",
            'domain name "fo_o.com" invalid (label "fo_o" invalid)',
        },
        set(),
    ),
    (
        "no-hosts-no-port",
        "{servers: [{}]}",
        {"server config must contain at least one host", "port is required"},
        set(),
    ),
    (
        "port-name-missing",
        "{servers: [{port: {number: 80, protocol: HTTP}, hosts: ['*']}]}",
        {'port name must be set: number:80 protocol:"HTTP"'},
        set(),
    ),
    (
        "unix-bind",
        "{servers: [{port: {number: 80, name: http, protocol: HTTP}, bind: 'unix://', hosts: ['*']}, "
        "{port: {number: 0, name: uds, protocol: HTTP}, bind: 'unix:///var/run/gw.sock', hosts: ['*']}]}",
        {
            "unix address must not be empty",
            'port number must be 0 for unix domain socket: number:80 protocol:"HTTP" name:"http"',
        },
        set(),
    ),
    (
        "ip-bind",
        "{servers: [{port: {number: 80, name: http, protocol: HTTP}, bind: 'not-an-ip', hosts: ['*']}]}",
        {"not-an-ip is not a valid IP"},
        set(),
    ),
    (
        "plain-http-with-certificates",
        "{servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ['*'], "
        "tls: {mode: SIMPLE, credentialName: c}}]}",
        {"server cannot have TLS settings for plain text HTTP ports"},
        set(),
    ),
    (
        "passthrough-with-certificates",
        f"{{servers: [{{port: {HTTPS}, hosts: ['*'], tls: {{mode: PASSTHROUGH, serverCertificate: "
        f"/c, privateKey: /k}}}}]}}",
        set(),
        {"PASSTHROUGH mode does not use certificates, they will be ignored"},
    ),
    (
        "several-certificate-sources",
        f"{{servers: [{{port: {HTTPS}, hosts: ['*'], tls: {{mode: SIMPLE, credentialName: c, "
        "serverCertificate: /c, privateKey: /k}}]}",
        {
            "only one of credential_name, credential_names, server_certificate/private_key, tls_certificates "
            "should be specified"
        },
        set(),
    ),
    (
        "istio-mutual-with-everything",
        f"{{servers: [{{port: {HTTPS}, hosts: ['*'], tls: {{mode: ISTIO_MUTUAL, serverCertificate: /c, "
        "privateKey: /k, caCertificates: /ca, tlsCertificates: [{serverCertificate: /c}], "
        "credentialNames: [a]}}]}",
        {
            "ISTIO_MUTUAL TLS cannot have associated server certificate",
            "ISTIO_MUTUAL TLS cannot have associated private key",
            "ISTIO_MUTUAL TLS cannot have associated CA bundle",
            "ISTIO_MUTUAL TLS cannot have associated tlsCertificates",
            "ISTIO_MUTUAL TLS cannot have associated credentialNames",
        },
        set(),
    ),
    (
        "tls-certificates",
        f"{{servers: [{{port: {HTTPS}, hosts: ['*'], tls: {{mode: OPTIONAL_MUTUAL, caCertificates: /ca, "
        "tlsCertificates: [{serverCertificate: /c1, privateKey: /k1}, {serverCertificate: /c2}, "
        "{privateKey: /k3}]}}]}",
        {"MUTUAL TLS requires a private key", "MUTUAL TLS requires a server certificate"},
        {"MUTUAL TLS can support up to 2 server certificates"},
    ),
    (
        "ciphers-and-old-tls",
        f"{{servers: [{{port: {HTTPS}, hosts: ['*'], tls: {{mode: SIMPLE, credentialName: c, "
        "minProtocolVersion: TLSV1_1, cipherSuites: [AES128-SHA, AES128-SHA, '-RC4', BAD, ALL]}}]}",
        set(),
        {"ignoring invalid cipher suites: [BAD]", "ignoring duplicate cipher suites: [AES128-SHA]"},
    ),
    (
        "old-tls-without-ciphers",
        f"{{servers: [{{port: {HTTPS}, hosts: ['*'], tls: {{mode: SIMPLE, credentialName: c, "
        "minProtocolVersion: TLSV1_0}}]}",
        set(),
        {
            "TLS version below TLSV1_2 require setting compatible ciphers as by default they no longer "
            "include "
            "compatible ciphers."
        },
    ),
    (
        # With a credential, SIMPLE/MUTUAL settings are not looked at further (CRL included).
        "crl-ignored-with-credential",
        f"{{servers: [{{port: {HTTPS}, hosts: ['*'], tls: {{mode: SIMPLE, credentialName: c, "
        f"caCrl: /crl}}}}]}}",
        set(),
        set(),
    ),
    (
        "crl-with-simple",
        f"{{servers: [{{port: {HTTPS}, hosts: ['*'], tls: {{mode: SIMPLE, serverCertificate: "
        "/c, privateKey: /k, "
        "caCrl: /crl}}]}",
        {"CRL is not supported with SIMPLE TLS"},
        set(),
    ),
    (
        "crl-with-credential-passthrough",
        f"{{servers: [{{port: {HTTPS}, hosts: ['*'], tls: {{mode: PASSTHROUGH, credentialName: c, "
        f"caCrl: /crl}}}}]}}",
        {"CRL is not supported with credentialName. CRL has to be specified in the credential"},
        {"PASSTHROUGH mode does not use certificates, they will be ignored"},
    ),
    (
        "bad-port-skips-protocol-tls-check",
        "{servers: [{port: {number: 0, name: https, protocol: HTTPS}, hosts: ['*']}]}",
        {"port number 0 must be in the range 1..65535"},
        set(),
    ),
    (
        "https-redirect-on-https",
        f"{{servers: [{{port: {HTTPS}, hosts: ['*'], tls: {{mode: SIMPLE, credentialName: c, "
        f"httpsRedirect: true}}}}]}}",
        set(),
        {"tls.httpsRedirect should only be used with http servers"},
    ),
    (
        "dns-name-with-uppercase",
        "{servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ['*']}]}",
        set(),
        set(),
    ),
]


@pytest.mark.parametrize(
    ("spec", "errors", "warnings"), [c[1:] for c in GATEWAY_CASES], ids=[c[0] for c in GATEWAY_CASES]
)
def test_gateway_rules(spec: Any, errors: set[str], warnings: set[str], validate: Callable[..., Any]) -> None:
    outcome = validate(GW, spec)
    assert set(outcome.errors) == errors
    assert set(outcome.warnings) == warnings


def test_gateway_semantics_relax_name_and_namespace(validate: Callable[..., Any]) -> None:
    spec = "{servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ['~/foo.com']}]}"
    annotations = {"internal.istio.io/gateway-semantics": "gateway"}
    assert validate(GW, spec, name="gw.istio", annotations=annotations).errors == []
    assert set(validate(GW, spec, name="gw.istio").errors) == {
        'invalid gateway name: "gw.istio"',
        'invalid namespace value "~" in gateway',
    }


SIDECAR_CASES: list[tuple[str, str, set[str], set[str]]] = [
    (
        # istiod 1.28 accepts only a bare "~" namespace (HEAD also takes "~ns").
        "egress-exclusion-namespaces-1.28",
        "{egress: [{hosts: ['~/*', '~ns1/*', '~Invalid_NS/*']}]}",
        {'invalid namespace value "~ns1" in sidecar', 'invalid namespace value "~Invalid_NS" in sidecar'},
        set(),
    ),
    (
        "egress-host-parts",
        "{egress: [{hosts: ['*', '/', 'ns/foo', 'ns/fo_o.com', 'ns/1.2.3.4', 'ns/*foo.com']}]}",
        {
            "host must be of form namespace/dnsName",
            "config namespace and dnsName in host entry cannot be empty",
            'invalid namespace value "" in sidecar',
            "short names (non FQDN) are not allowed",
            "empty domain name not allowed",
            'domain name "fo_o.com" invalid (label "fo_o" invalid)',
            'domain name "2.3.4" invalid (top level domain "4" cannot be all-numeric)',
            'partial wildcard "*foo.com" not allowed',
        },
        set(),
    ),
    (
        "egress-duplicates",
        "{egress: [{hosts: ['ns1/*', 'ns1/a.com', './b.com', 'default/*', '*/*']}]}",
        set(),
        {
            "duplicated egress host: ns1/a.com",
            "duplicated egress host: default/*",
            "`*/*` host select all resources, no other hosts can be added",
        },
    ),
    (
        "egress-ports",
        "{egress: [{port: {number: 80, protocol: HTTP, name: Bad_Name, targetPort: 8080}, bind: "
        "1.2.3, hosts: ['*/*']}, "
        "{port: {number: 80, protocol: FOO}, hosts: ['*/*']}, {port: {number: 0, protocol: HTTP}, "
        "hosts: ['*/*']}, "
        "{port: {number: 0}, bind: 'unix:///a.sock', captureMode: IPTABLES, hosts: ['*/*']}, "
        "{port: {number: 0}, bind: 'unix:///a.sock', hosts: ['*/*']}, {port: {number: 81}, hosts: []}]}",
        {
            "targetPort has no impact on Sidecars",
            "invalid port name: Bad_Name",
            "1.2.3 is not a valid IP",
            "unsupported protocol: FOO",
            "sidecar: ports on IP bound listeners must be unique",
            "sidecar: ports with 0 value must have a unix domain socket bind address",
            "sidecar: captureMode must be DEFAULT/NONE for unix domain socket listeners",
            "sidecar: unix domain socket values for listeners must be unique",
            "sidecar: egress listener must contain at least one host",
        },
        set(),
    ),
    (
        "ingress-listeners",
        "{ingress: [{defaultEndpoint: '127.0.0.1:80'}, {port: {number: 80, protocol: HTTP, name: a}, "
        "bind: bad}, "
        "{port: {number: 80, protocol: HTTP, name: b, targetPort: 1}, defaultEndpoint: foo}, "
        "{port: {number: 81, protocol: TCP, name: c}, defaultEndpoint: ':abc'}, "
        "{port: {number: 82, protocol: TCP, name: d}, defaultEndpoint: '0.0.0.0:70000'}, "
        "{port: {number: 83, protocol: TCP, name: e}, defaultEndpoint: 'unix://relative'}]}",
        {
            "sidecar: port is required for ingress listeners",
            "bad is not a valid IP",
            "targetPort has no impact on Sidecars",
            "sidecar: ports on IP bound listeners must be unique",
            "address foo: missing port in address",
            'sidecar: defaultEndpoint port () is not a number: strconv.Atoi: parsing "": invalid syntax',
            'sidecar: defaultEndpoint port (abc) is not a number: strconv.Atoi: parsing "abc": invalid '
            "syntax",
            "port number 70000 must be in the range 1..65535",
            "relative is not an absolute path to a file",
        },
        set(),
    ),
    (
        "ingress-tls",
        "{ingress: [{port: {number: 80, protocol: HTTP, name: h}, tls: {mode: ISTIO_MUTUAL, "
        "httpsRedirect: true, "
        "subjectAltNames: [a], credentialName: c, credentialNames: [c], tlsCertificates: "
        "[{privateKey: k}]}}]}",
        {
            "sidecar: subjectAltNames is not supported in ingress tls",
            "sidecar: httpsRedirect is not supported",
            "sidecar: credentialName is not currently supported",
            "sidecar: credentialNames is not currently supported",
            "sidecar: tls_certificates is not currently supported",
            "configuration is invalid: cannot set mode to ISTIO_MUTUAL in sidecar ingress tls",
            "server cannot have TLS settings for non HTTPS/TLS ports",
            "ISTIO_MUTUAL TLS cannot have associated credentialName",
            "ISTIO_MUTUAL TLS cannot have associated credentialNames",
            "ISTIO_MUTUAL TLS cannot have associated tlsCertificates",
        },
        set(),
    ),
    (
        "ingress-connection-pools",
        "{ingress: [{port: {number: 9000, protocol: TCP, name: raw}, connectionPool: {http: "
        "{maxRetries: 3}}}, "
        "{port: {number: 9001, protocol: TCP, name: other}, connectionPool: {}}], inboundConnectionPool: {}}",
        {"connection pool must have at least one field"},
        {
            'sidecar: HTTP connection pool settings are configured for port 9000 ("raw") but its protocol '
            "is not "
            "HTTP (TCP); only TCP settings will apply"
        },
    ),
    (
        "egress-proxy",
        "{outboundTrafficPolicy: {mode: ALLOW_ANY, egressProxy: {host: '*.proxy.com', "
        "subset: 'bad.subset'}}}",
        {
            'domain name "*.proxy.com" invalid (label "*" invalid)',
            "sidecar: egress_proxy port must be non-nil",
        },
        set(),
    ),
    (
        "egress-proxy-destination",
        "{outboundTrafficPolicy: {mode: ALLOW_ANY, egressProxy: {host: proxy.com, subset: "
        "'bad.subset', port: {}}}}",
        {"subset name is invalid: bad.subset", "port number 0 must be in the range 1..65535"},
        set(),
    ),
    ("outbound-policy-alone", "{outboundTrafficPolicy: {mode: REGISTRY_ONLY}}", set(), set()),
    (
        "selector-errors-stop-validation",
        "{workloadSelector: {labels: {'': x}}, egress: [{hosts: [bad]}]}",
        {'empty key is not supported in selector: "=x"'},
        set(),
    ),
    (
        "empty-config-drops-selector-warning",
        "{workloadSelector: {}}",
        {"sidecar: empty configuration provided"},
        set(),
    ),
]


@pytest.mark.parametrize(
    ("spec", "errors", "warnings"), [c[1:] for c in SIDECAR_CASES], ids=[c[0] for c in SIDECAR_CASES]
)
def test_sidecar_rules(spec: Any, errors: set[str], warnings: set[str], validate: Callable[..., Any]) -> None:
    outcome = validate(SC, spec)
    assert set(outcome.errors) == errors
    assert set(outcome.warnings) == warnings


def test_sidecar_reports_a_bad_host_twice(validate: Callable[..., Any]) -> None:
    # istiod appends the hostname error once as a sidecar host and once as a non-IP host.
    errors = validate(SC, "{egress: [{hosts: ['ns/fo_o.com']}]}").errors
    assert errors == ['domain name "fo_o.com" invalid (label "fo_o" invalid)'] * 2
