"""PeerAuthentication, AuthorizationPolicy and RequestAuthentication beyond the reference table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

PA, AP, RA = "PeerAuthentication", "AuthorizationPolicy", "RequestAuthentication"
P = "invalid policy x.default: "
DENY_WARNING = (
    "configured AuthorizationPolicy will deny all traffic to TCP ports under its scope due to the use "
    "of only HTTP attributes in a DENY rule; it is recommended to explicitly specify the port"
)

AUTHZ_CASES: list[tuple[str, str, set[str], set[str]]] = [
    (
        "custom-without-rules",
        "{action: CUSTOM, provider: {name: p}}",
        {
            "CUSTOM action without `rules` is meaningless as it will never be triggered, add an empty rule "
            "`{}` if you want it be triggered for every request"
        },
        set(),
    ),
    (
        "custom-unsupported-attributes",
        "{action: CUSTOM, provider: {name: p}, rules: [{from: [{source: {namespaces: [a], "
        "notPrincipals: [b], "
        "requestPrincipals: [c], ipBlocks: [1.2.3.4]}}], when: [{key: 'request.auth.claims[iss]', "
        "values: [x]}, "
        "{key: source.principal, values: [y]}, {key: source.ip, values: [1.2.3.4]}]}]}",
        {
            "From.Namespaces is currently not supported with CUSTOM action",
            "From.NotPrincipals is currently not supported with CUSTOM action",
            "From.RequestPrincipals is currently not supported with CUSTOM action",
            "request.auth.claims[iss] is currently not supported with CUSTOM action",
            "source.principal is currently not supported with CUSTOM action",
        },
        set(),
    ),
    (
        "source-values",
        "{rules: [{from: [{source: {principals: [''], notNamespaces: [''], serviceAccounts: ['a/b/c'], "
        "notServiceAccounts: ['*'], ipBlocks: ['1.2.3.4/33'], notRemoteIpBlocks: [''], requestPrincipals: "
        "['']}}]}]}",
        {
            "empty value not allowed, found in Principals",
            "empty value not allowed, found in NotNamespaces",
            "empty value not allowed, found in RequestPrincipals",
            "empty value not allowed, found in NotRemoteIpBlocks",
            "expected format 'serviceAccount' or 'namespace/serviceAccount', found \"a/b/c\" in "
            "ServiceAccounts",
            "wildcard not allowed, found in NotServiceAccounts",
            'bad CIDR range (1.2.3.4/33): netip.ParsePrefix("1.2.3.4/33"): prefix length out of range',
            "bad IP address ()",
            "cannot set serviceAccounts with namespaces or principals, found at rule 0",
        },
        set(),
    ),
    (
        "service-accounts",
        "{rules: [{from: [{source: {serviceAccounts: ['/sa']}}, {source: {serviceAccounts: ['ns/']}}, "
        "{source: {notServiceAccounts: [a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p, q]}}]}]}",
        {
            "expected format 'serviceAccount' or 'namespace/serviceAccount', found empty namespace \"/sa\" "
            "in ServiceAccounts",
            "expected format 'serviceAccount' or 'namespace/serviceAccount', found empty serviceAccount "
            '"ns/" in ServiceAccounts',
            "may not have more than 16 values",
        },
        set(),
    ),
    (
        # As the reference istiod (1.31): trustDomains is a source, source.trustDomain a condition.
        "trust-domains",
        "{rules: [{from: [{source: {trustDomains: [cluster.local, 'a/b']}}], "
        "when: [{key: source.trustDomain, values: ['*x*']}]}]}",
        {
            "trust domain must not contain '/', found in TrustDomains: \"a/b\"",
            "invalid `value` for `key` source.trustDomain: at most one wildcard is allowed, "
            'found in source.trustDomain: "*x*"',
        },
        set(),
    ),
    (
        "operations",
        "{rules: [{to: [{operation: {}}, {operation: {ports: [abc, ''], methods: [''], "
        "paths: ['/a/{x}', '/a/{*}/b c', '/{*}//x'], notPaths: ['/{**}/{*}']}}, {}]}]}",
        {
            "`to.operation` must not be empty, found at rule 0",
            'bad port (abc): strconv.ParseUint: parsing "abc": invalid syntax',
            'bad port (): strconv.ParseUint: parsing "": invalid syntax',
            "empty value not allowed, found in Ports",
            "empty value not allowed, found in Methods",
            "invalid or unsupported path a/{x}, found in Paths. Contains '{' or '}' beyond a supported path "
            "template",
            "invalid or unsupported path {**}/{*}, found in NotPaths. {**} is not the last operator",
            "`to.operation` must not be nil, found at rule 0",
        },
        set(),
    ),
    (
        "path-literal",
        "{rules: [{to: [{operation: {paths: ['/a/{*}/b c']}}]}]}",
        {
            "invalid or unsupported path a/{*}/b c, found in Paths. Contains segment b c with invalid "
            "string literal"
        },
        set(),
    ),
    (
        "conditions",
        "{rules: [{when: [{key: '', values: [a]}, {key: 'request.headers[x]'}, {key: "
        "request.headers, values: [a]}, "
        "{key: destination.port, notValues: ['70000']}, {key: source.ip, values: [bad]}, "
        "{key: destination.namespace, values: [ns]}, {key: 'destination.labels[app]', values: [a]}, "
        "{key: destination.user, values: [u]}, {key: remote.ip, values: ['']}]}]}",
        {
            "`key` must not be empty",
            "at least one of `values` or `notValues` must be set for key request.headers[x]",
            "invalid `value` for `key` request.headers: bad key (request.headers): should have format a[b]",
            "invalid `notValue` for `key` request.headers: bad key (request.headers): should have format "
            "a[b]",
            "invalid `notValue` for `key` destination.port: bad port (70000): <nil>",
            "invalid `value` for `key` source.ip: bad IP address (bad)",
            "invalid `value` for `key` destination.namespace: attribute destination.namespace is replaced by "
            "the metadata.namespace",
            "invalid `notValue` for `key` destination.namespace: attribute destination.namespace is replaced "
            "by the metadata.namespace",
            "invalid `value` for `key` destination.labels[app]: attribute destination.labels[app] is "
            "replaced "
            "by the workload selector",
            "invalid `notValue` for `key` destination.labels[app]: attribute destination.labels[app] is "
            "replaced by the workload selector",
            "invalid `value` for `key` destination.user: deprecated attribute destination.user: only "
            "supported "
            "in v1alpha1",
            "invalid `notValue` for `key` destination.user: deprecated attribute destination.user: only "
            "supported in v1alpha1",
            "invalid `value` for `key` remote.ip: empty value not allowed, found in remote.ip",
        },
        set(),
    ),
    (
        "target-refs",
        "{targetRefs: [{kind: Service}, {kind: Gateway, group: gateway.networking.k8s.io, name: "
        "g, namespace: o}]}",
        {
            "targetRef name must be set",
            "targetRef namespace must not be set; cross namespace referencing is not supported",
        },
        set(),
    ),
    (
        "selector-warning-is-not-prefixed",
        "{selector: {}, rules: [{}]}",
        set(),
        {"workload selector specified without labels"},
    ),
    (
        "deny-request-principals-only",
        "{action: DENY, rules: [{from: [{source: {requestPrincipals: ['*']}}]}]}",
        set(),
        {DENY_WARNING},
    ),
    (
        "deny-with-tcp-attributes",
        "{action: DENY, rules: [{from: [{source: {ipBlocks: [1.2.3.4]}}]}, {to: [{operation: "
        "{notPorts: ['22']}}]}]}",
        set(),
        set(),
    ),
    ("deny-empty-rule-matches-everything", "{action: DENY, rules: [{}]}", set(), set()),
]


@pytest.mark.parametrize(
    ("spec", "errors", "warnings"), [c[1:] for c in AUTHZ_CASES], ids=[c[0] for c in AUTHZ_CASES]
)
def test_authorization_policy_rules(
    spec: Any, errors: set[str], warnings: set[str], validate: Callable[..., Any]
) -> None:
    outcome = validate(AP, spec)
    # Every AuthorizationPolicy error carries the policy's name; warnings do not.
    assert set(outcome.errors) == {P + e for e in errors}
    assert set(outcome.warnings) == warnings


def test_authorization_policy_prefix_uses_name_and_namespace(validate: Callable[..., Any]) -> None:
    outcome = validate(AP, "{action: DENY}", name="deny-all", namespace="prod")
    assert len(outcome.errors) == 1
    assert outcome.errors[0].startswith("invalid policy deny-all.prod: DENY action without `rules`")


@pytest.mark.parametrize(
    ("action", "value", "error"),
    [
        ("ALLOW", "true", None),
        ("DENY", "F", None),
        (
            "DENY",
            "",
            "default/x has annotation istio.io/dry-run with invalid value (): strconv.ParseBool: "
            'parsing "": invalid syntax',
        ),
        (
            "AUDIT",
            "true",
            "the annotation istio.io/dry-run currently only supports action ALLOW/DENY, "
            "found action AUDIT in default/x",
        ),
        (
            "CUSTOM",
            "true",
            "the annotation istio.io/dry-run currently only supports action ALLOW/DENY, "
            "found action CUSTOM in default/x",
        ),
    ],
)
def test_dry_run_annotation(action: str, value: str, error: str | None, validate: Callable[..., Any]) -> None:
    spec = (
        f"{{action: {action}, provider: {{name: p}}, rules: [{{}}]}}"
        if action == "CUSTOM"
        else (f"{{action: {action}, rules: [{{}}]}}")
    )
    outcome = validate(AP, spec, annotations={"istio.io/dry-run": value})
    assert outcome.errors == ([error] if error else [])


def test_dry_run_error_comes_before_the_policy_checks(validate: Callable[..., Any]) -> None:
    outcome = validate(
        AP, "{action: AUDIT, rules: [{from: [{source: {}}]}]}", annotations={"istio.io/dry-run": "1"}
    )
    assert outcome.errors == [
        "the annotation istio.io/dry-run currently only supports action ALLOW/DENY, found action AUDIT in "
        "default/x"
    ]


PEER_CASES: list[tuple[str, str, set[str], set[str]]] = [
    (
        "ports-zero",
        "{selector: {matchLabels: {app: a}}, portLevelMtls: {'0': {mode: STRICT}, '80': {mode: DISABLE}}}",
        {"port must be in range 1..65535"},
        set(),
    ),
    (
        "selector-without-labels-and-ports",
        "{selector: {}, portLevelMtls: {'80': {mode: STRICT}}}",
        {"mesh/namespace peer authentication cannot have port level mTLS"},
        {"workload selector specified without labels"},
    ),
    (
        "selector-wildcard",
        "{selector: {matchLabels: {app: 'a*'}}}",
        {'wildcard is not supported in selector: "app=a*"'},
        set(),
    ),
    ("mesh-wide", "{mtls: {mode: PERMISSIVE}}", set(), set()),
]


@pytest.mark.parametrize(
    ("spec", "errors", "warnings"), [c[1:] for c in PEER_CASES], ids=[c[0] for c in PEER_CASES]
)
def test_peer_authentication_rules(
    spec: Any, errors: set[str], warnings: set[str], validate: Callable[..., Any]
) -> None:
    outcome = validate(PA, spec)
    assert set(outcome.errors) == errors
    assert set(outcome.warnings) == warnings


REQUEST_AUTHN_CASES: list[tuple[str, Any, set[str], set[str]]] = [
    (
        "rule-fields",
        "{jwtRules: [{issuer: i, audiences: ['', a, ''], fromHeaders: [{name: ''}], fromParams: [''], "
        "fromCookies: [''], outputClaimToHeaders: [{header: x}, {claim: c, header: 'a.b'}], timeout: 0s}]}",
        {
            "audience must be non-empty string",
            "location header name must be non-empty string",
            "location query must be non-empty string",
            "cookie name must be non-empty string",
            "outputClaimToHeaders header and claim value must be non-empty string",
            "header name a.b is not a valid header name",
            "duration must be greater than 1ms",
        },
        set(),
    ),
    (
        "jwks-uri-parse-errors",
        "{jwtRules: [{jwksUri: 'https://a:b/keys'}, {jwksUri: 'keys.json'}, {jwksUri: ':foo'}, "
        "{jwksUri: 'https://a:99999999999999999999/x'}]}",
        {
            'parse "https://a:b/keys": invalid port ":b" after host',
            'URI scheme "" is not supported',
            'parse ":foo": missing protocol scheme',
            'strconv.Atoi: parsing "99999999999999999999": value out of range',
        },
        set(),
    ),
    ("jwks-uri-http-uppercase-scheme", "{jwtRules: [{jwksUri: 'HTTP://a.com:8080/keys'}]}", set(), set()),
    (
        "targets",
        "{selector: {matchLabels: {a: b}}, targetRefs: [{kind: ServiceEntry, group: "
        "networking.istio.io, name: s}], "
        "jwtRules: [{issuer: i}]}",
        {"only one of targetRefs or workloadSelector can be set"},
        set(),
    ),
    (
        "selector-warning",
        "{selector: {}, jwtRules: [{issuer: i}]}",
        set(),
        {"workload selector specified without labels"},
    ),
    ("single-jwk", {"jwtRules": [{"issuer": "i", "jwks": '{"kty": "oct", "k": "c2VjcmV0"}'}]}, set(), set()),
]


@pytest.mark.parametrize(
    ("spec", "errors", "warnings"),
    [c[1:] for c in REQUEST_AUTHN_CASES],
    ids=[c[0] for c in REQUEST_AUTHN_CASES],
)
def test_request_authentication_rules(
    spec: Any, errors: set[str], warnings: set[str], validate: Callable[..., Any]
) -> None:
    outcome = validate(RA, spec)
    assert set(outcome.errors) == errors
    assert set(outcome.warnings) == warnings


@pytest.mark.parametrize(
    "jwks",
    [
        "not json",
        "[1, 2]",
        '{"keys": {}}',
        '{"keys": [{"kty": "FOO"}]}',
        '{"keys": [{"kty": "RSA", "e": "AQAB"}]}',
        '{"keys": [{"kty": "EC", "crv": "P-256", "x": "!!", "y": "AQAB"}]}',
        '{"kid": "no-kty"}',
    ],
)
def test_bad_inline_jwks(jwks: str, validate: Callable[..., Any]) -> None:
    outcome = validate(RA, {"jwtRules": [{"issuer": "i", "jwks": jwks}]})
    assert len(outcome.errors) == 1
    # The rest of the text is the JWK library's own wording.
    assert outcome.errors[0].startswith("jwks parse error: ")
