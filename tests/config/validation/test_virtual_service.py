"""VirtualService rules beyond the reference table, compared as exact sets of errors and warnings."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

VS = "VirtualService"
R2 = "route: [{destination: {host: a}, weight: 50}, {destination: {host: b}, weight: 50}]"

# (id, spec, errors, warnings)
CASES: list[tuple[str, str, set[str], set[str]]] = [
    (
        "delegate-with-tls-and-tcp",
        "{tls: [{match: [{sniHosts: [a.com]}], route: [{destination: {host: a}}]}], "
        "tcp: [{route: [{destination: {host: a}}]}]}",
        {
            "delegate virtual service must have no tls route specified",
            "delegate virtual service must have no tcp route specified",
            'SNI host "a.com" is not a compatible subset of any of the virtual service hosts: []',
        },
        set(),
    ),
    (
        "root-route-with-redirect-and-route",
        "{hosts: [a.com], http: [{name: r, delegate: {name: d}, redirect: {uri: /x}, $R}]}",
        {"root HTTP route r must not specify redirect", "root HTTP route r must not specify route"},
        set(),
    ),
    (
        "delegate-vs-route-with-delegate",
        "{http: [{delegate: {name: d}, $R}]}",
        {"delegate HTTP route cannot contain delegate"},
        set(),
    ),
    (
        "redirect-conflicts",
        "{hosts: [a.com], http: [{redirect: {uri: /x}, $R, fault: {delay: {fixedDelay: 1s}}, "
        "rewrite: {uri: /y}, directResponse: {status: 200}}]}",
        {
            "HTTP route cannot contain both route and redirect",
            "HTTP route cannot contain both fault and redirect",
            "HTTP route rule cannot contain both rewrite and redirect",
            "HTTP route rule cannot contain both direct_response and redirect",
        },
        set(),
    ),
    (
        "direct-response-conflicts",
        "{hosts: [a.com], http: [{directResponse: {status: 200}, $R, rewrite: {uri: /y}}]}",
        {
            "HTTP route cannot contain both route and direct_response",
            "HTTP route rule cannot contain both rewrite and direct_response",
        },
        set(),
    ),
    (
        "mirror-and-mirrors",
        "{hosts: [a.com], http: [{$R, mirror: {host: m}, mirrors: [{destination: {host: m2}}]}]}",
        {"HTTP route cannot contain both mirror and mirrors"},
        set(),
    ),
    (
        "mirrors-checks",
        "{hosts: [a.com], http: [{$R, mirrors: [{percentage: {value: 5}}, "
        "{destination: {host: '*'}, percentage: {value: -1}}]}]}",
        {
            "destination is required for mirrors",
            "invalid destination host *",
            "mirror percentage must have a min value of 0 (it has -1.000000)",
        },
        set(),
    ),
    (
        "mirror-percent-over-100",
        "{hosts: [a.com], http: [{$R, mirror: {host: m}, mirrorPercent: 101}]}",
        {"mirror_percent must have a max value of 100 (it has 101)"},
        {'using deprecated setting "mirrorPercent", use "mirrorPercentage" instead'},
    ),
    (
        "jwt-claim-without-gateways",
        "{hosts: [a.com], http: [{$R, match: [{withoutHeaders: {'@request.auth.claims[group]': "
        "{exact: x}}}]}]}",
        {
            "JWT claim based routing (key: @request.auth.claims[group]) is only supported for gateway, "
            "found no gateways: []"
        },
        set(),
    ),
    (
        "jwt-claim-on-gateway-is-fine",
        "{hosts: [a.com], gateways: [ns/gw], http: [{$R, match: [{headers: {'@request.auth.claims.sub': "
        "{exact: x}}}]}]}",
        set(),
        set(),
    ),
    (
        "only-first-unqualified-gateway-name-is-checked",
        "{hosts: [a.com], gateways: [gw, 'bad/*', 'b@d'], http: [{$R}]}",
        set(),
        set(),
    ),
    (
        "bad-unqualified-gateway-name",
        "{hosts: [a.com], gateways: ['b@dgateway'], http: [{$R}]}",
        {'domain name "b@dgateway" invalid (label "b@dgateway" invalid)'},
        set(),
    ),
    (
        "gateway-name-parts",
        "{hosts: [a.com], gateways: ['/gw', 'Bad_ns/gw'], http: [{$R}]}",
        {
            "config namespace and gateway name cannot be empty",
            'invalid value for namespace: ""',
            'invalid value for namespace: "Bad_ns"',
        },
        set(),
    ),
    (
        "legacy-gateway-warning-dropped-in-http-match",
        "{hosts: [a.com], http: [{$R, match: [{gateways: [gw.example.com]}]}]}",
        set(),
        set(),
    ),
    (
        "legacy-gateway-warning-kept-in-tls-match",
        "{hosts: [a.com], gateways: [ns/gw], tls: [{match: [{sniHosts: [a.com], "
        "gateways: [gw.example.com]}], "
        "route: [{destination: {host: a}}]}]}",
        set(),
        {
            'using legacy gatewayName format "gw.example.com"; prefer the <namespace>/<name> format: '
            '"example/gw"'
        },
    ),
    ("ip-host-is-accepted", "{hosts: [10.0.0.1], http: [{$R}]}", set(), set()),
    ("wildcard-host-on-gateway-only", "{hosts: ['*'], gateways: [ns/gw], http: [{$R}]}", set(), set()),
    (
        "wildcard-host-on-mesh-and-gateway",
        "{hosts: ['*'], gateways: [ns/gw, mesh], http: [{$R}]}",
        {"wildcard host * is not allowed for virtual services bound to the mesh gateway"},
        set(),
    ),
    (
        "no-duplicate-check-after-invalid-host",
        "{hosts: ['a.com', 'a.com', 'b_c.com'], http: [{$R}]}",
        {'domain name "b_c.com" invalid (label "b_c" invalid)'},
        set(),
    ),
    (
        "match-checks",
        "{hosts: [a.com], http: [{$R, match: [{port: 70000, sourceLabels: {'a b': x}, "
        "sourceNamespace: Bad_NS, "
        "scheme: {regex: ''}, method: {prefix: ''}, authority: {regex: 'a(?=b)'}, "
        "withoutHeaders: {x-a: {regex: '*'}, x-b: {prefix: ''}}, queryParams: {q: {prefix: ''}}}]}]}",
        {
            "port number 70000 must be in the range 1..65535",
            'invalid tag key: "a b"',
            "sourceNamespace match Bad_NS is invalid",
            '"scheme": regex string match should not be empty',
            '"method": prefix string match should not be empty',
            '"authority": error parsing regexp: invalid or unsupported Perl syntax: `(?=`; '
            "Istio uses RE2 style regex-based match (https://github.com/google/re2/wiki/Syntax)",
            '"withoutHeaders": prefix string match should not be empty',
            '"queryParams": prefix string match should not be empty',
        },
        set(),
    ),
    (
        "empty-uri-prefix-is-fine",
        "{hosts: [a.com], http: [{$R, match: [{uri: {prefix: ''}}]}]}",
        set(),
        set(),
    ),
    (
        "redirect-port-out-of-range",
        "{hosts: [a.com], http: [{redirect: {port: 70000}}]}",
        {"port number 70000 must be in the range 1..65535"},
        set(),
    ),
    (
        # istiod 1.28 does not know prefixRewrite, so it does not count as a redirect target.
        "redirect-prefix-rewrite-alone-1.28",
        "{hosts: [a.com], http: [{match: [{uri: {regex: /a.*}}], redirect: {prefixRewrite: /b}}]}",
        {"redirect must specify URI, authority, scheme, or port"},
        set(),
    ),
    (
        "redirect-derive-port",
        "{hosts: [a.com], http: [{redirect: {derivePort: FROM_REQUEST_PORT}}]}",
        set(),
        set(),
    ),
    (
        "direct-response-too-large",
        {
            "hosts": ["a.com"],
            "http": [{"directResponse": {"status": 200, "body": {"string": "x" * 1048577}}}],
        },
        {"large direct_responses may impact control plane performance, must be less than 1MB"},
        set(),
    ),
    (
        "direct-response-large",
        {"hosts": ["a.com"], "http": [{"directResponse": {"status": 600, "body": {"string": "x" * 102401}}}]},
        set(),
        {"large direct_responses may impact control plane performance"},
    ),
    (
        "retry-on-entries-are-not-trimmed",
        "{hosts: [a.com], http: [{$R, retries: {attempts: 2, retryOn: '5xx, reset,503,599,retriable-4xx'}}]}",
        {'" reset" is not a valid retryOn policy', '"599" is not a valid retryOn policy'},
        set(),
    ),
    (
        "retry-negative-attempts-and-durations",
        "{hosts: [a.com], http: [{$R, retries: {attempts: -1, perTryTimeout: 0s, backoff: 1.5ms}}]}",
        {
            "attempts cannot be negative",
            "duration must be greater than 1ms",
            "only durations to ms precision are supported",
        },
        set(),
    ),
    (
        "rewrite-uri-and-regex",
        "{hosts: [a.com], http: [{$R, rewrite: {uri: /a, uriRegexRewrite: {match: a, rewrite: b}}}]}",
        {"rewrite may only contain one of URI or UriRegexRewrite"},
        set(),
    ),
    (
        "rewrite-regex-incomplete",
        "{hosts: [a.com], http: [{$R, rewrite: {uriRegexRewrite: {match: a}}}]}",
        {
            "UriRegexRewrite has errors\nUriRegexRewrite requires both Rewrite and Match fields to be "
            "specified"
        },
        set(),
    ),
    (
        "rewrite-regex-invalid",
        "{hosts: [a.com], http: [{$R, rewrite: {uriRegexRewrite: {match: '(', rewrite: b}}}]}",
        {
            'UriRegexRewrite has errors\n"HTTPRewrite.UriRegexRewrite.Match": error parsing regexp: '
            "missing closing ): `(`; Istio uses RE2 style regex-based match "
            "(https://github.com/google/re2/wiki/Syntax)"
        },
        set(),
    ),
    (
        "authority-set-twice-by-headers",
        "{hosts: [a.com], http: [{$R, headers: {request: {set: {Host: a}, add: {':authority': b}}}}]}",
        {'authority header cannot be set multiple times: have "a", attempting to set "b"'},
        set(),
    ),
    (
        "fault-abort-without-type-is-silently-accepted",
        "{hosts: [a.com], http: [{$R, fault: {abort: {percentage: {value: 10}}}}]}",
        set(),
        set(),
    ),
    (
        "fault-other-checks",
        "{hosts: [a.com], http: [{$R, fault: {abort: {http2Error: x, percentage: {value: 0.00001}}, "
        "delay: {exponentialDelay: 1s}}}]}",
        {
            "HTTP/2 abort fault injection not supported yet",
            "percentage 1e-05 is neither 0.0, nor in range [0.0001, 100.0]",
            "exponentialDelay not supported yet",
        },
        set(),
    ),
    (
        "fault-status-600-passes",
        "{hosts: [a.com], http: [{$R, fault: {abort: {httpStatus: 600}}}]}",
        set(),
        set(),
    ),
    (
        "cors",
        "{hosts: [a.com], http: [{$R, corsPolicy: {allowOrigins: [{exact: ''}, {}, {regex: '['}], "
        "allowHeaders: [''], exposeHeaders: ['a b'], maxAge: 1.5s}}]}",
        {
            "'' is not a valid match type for CORS allow origins",
            '"corsPolicy.allowOrigins": error parsing regexp: missing closing ]: `[`; '
            "Istio uses RE2 style regex-based match (https://github.com/google/re2/wiki/Syntax)",
            "header name cannot be empty",
            "header name a b is not a valid header name",
            "max_age duration is accurate only to seconds precision",
        },
        set(),
    ),
    (
        "destination-checks",
        "{hosts: [a.com], http: [{route: [{destination: {host: '', subset: v1.0, port: {}}}]}]}",
        {
            "empty domain name not allowed",
            "subset name is invalid: v1.0",
            "port number 0 must be in the range 1..65535",
        },
        set(),
    ),
    (
        "destination-required",
        "{hosts: [a.com], http: [{route: [{weight: 100}]}]}",
        {"destination is required"},
        set(),
    ),
    ("weights-can-be-split", f"{{hosts: [a.com], http: [{{{R2}}}]}}", set(), set()),
    (
        "route-destination-headers",
        "{hosts: [a.com], http: [{route: [{destination: {host: a}, headers: {request: {remove: [':path']}, "
        "response: {set: {host: x}}}}]}]}",
        {
            'invalid header ":path": header cannot have ":" prefix',
            'invalid header "host": cannot set Host header',
        },
        set(),
    ),
    (
        "star-destination-rejected-on-gateway-too",
        "{hosts: [a.com], gateways: [ns/gw], http: [{route: [{destination: {host: '*'}}]}]}",
        {"invalid destination host *"},
        set(),
    ),
    (
        "tls-route-checks",
        "{hosts: [a.com], gateways: [mesh], tls: [{match: [{sniHosts: ['*.b.com'], "
        "destinationSubnets: [1.2.3.4/40], "
        "port: 70000, sourceLabels: {'a b': x}}, {}]}]}",
        {
            'SNI host "*.b.com" is not a compatible subset of any of the virtual service hosts: [a.com]',
            "1.2.3.4/40 is not a valid CIDR block",
            "port number 70000 must be in the range 1..65535",
            'invalid tag key: "a b"',
            "TLS match must have at least one SNI host",
            "TLS route is required",
        },
        set(),
    ),
    (
        "tls-route-needs-match",
        "{hosts: [a.com], tls: [{route: [{destination: {host: a}}]}]}",
        {"TLS route must have at least one match condition"},
        set(),
    ),
    (
        "auto-passthrough-sni-names",
        "{hosts: ['*.global'], gateways: [ns/gw], tls: [{match: [{sniHosts: ['outbound_.80_._.a.global']}], "
        "route: [{destination: {host: a}}]}]}",
        set(),
        set(),
    ),
    (
        "tcp-match-checks",
        "{hosts: [a.com], tcp: [{match: [{destinationSubnets: [bad], gateways: [gw.example.com]}], "
        "route: [{destination: {host: a}, weight: -5}]}]}",
        {"bad is not a valid IP", "weight -5 < 0"},
        set(),
    ),
    (
        "export-to-duplicates",
        "{hosts: [a.com], exportTo: [default, '.'], http: [{$R}]}",
        {"duplicate entries in exportTo: . and current namespace default"},
        set(),
    ),
    (
        "analysis-duplicate-matches",
        "{hosts: [a.com], http: [{name: first, match: [{name: m, uri: {exact: /a}}], $R}, "
        "{match: [{name: other, uri: {exact: /a}}], $R}, {match: [{uri: {exact: /b}}, {uri: {exact: "
        "/a}}], $R}]}",
        set(),
        {
            'virtualService rule #1 match "other" is not used (duplicate/overlapping match in rule "first")',
            "virtualService rule #1 not used (all matches used by prior rules)",
            'virtualService rule #2 match #1 is not used (duplicate/overlapping match in rule "first")',
        },
    ),
    (
        "analysis-after-catch-all",
        "{hosts: [a.com], http: [{$R}, {name: late, match: [{uri: {exact: /a}}, {uri: {exact: /b}}], $R}]}",
        set(),
        {'virtualService rule "late" not used (route without matches defined before)'},
    ),
    (
        "analysis-tcp-duplicates",
        "{hosts: [a.com], tcp: [{match: [{port: 80}], route: [{destination: {host: a}}]}, "
        "{match: [{port: 80}], route: [{destination: {host: b}}]}]}",
        set(),
        {
            "virtualService rule #1 match #0 is not used (duplicate/overlapping match in rule #0)",
            "virtualService rule #1 not used (all matches used by prior rules)",
        },
    ),
    (
        "analysis-prefix-not-covered-when-headers-differ",
        "{hosts: [a.com], http: [{$R, match: [{uri: {prefix: /api}}, {uri: {prefix: /api/v1}, "
        "headers: {x: {exact: y}}}]}]}",
        set(),
        set(),
    ),
    (
        "analysis-prefix-not-covered-when-method-differs",
        "{hosts: [a.com], http: [{$R, match: [{uri: {prefix: /api}}, {uri: {prefix: /api/v1}, "
        "method: {exact: POST}}]}]}",
        set(),
        set(),
    ),
]


@pytest.mark.parametrize(("spec", "errors", "warnings"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_virtual_service_rules(
    spec: Any, errors: set[str], warnings: set[str], validate: Callable[..., Any]
) -> None:
    outcome = validate(VS, spec)
    assert set(outcome.errors) == errors
    assert set(outcome.warnings) == warnings


def test_gateway_route_semantics_relax_destination_and_gateway_names(validate: Callable[..., Any]) -> None:
    annotations = {"internal.istio.io/route-semantics": "gateway"}
    spec = "{hosts: [a.com], gateways: ['ns/gw.with.dots'], http: [{route: [{destination: {host: '*'}}]}]}"
    assert validate(VS, spec, annotations=annotations).errors == []
    assert set(validate(VS, spec).errors) == {
        'invalid value for gateway name: "gw.with.dots"',
        "invalid destination host *",
    }


def test_after_catch_all_each_match_is_reported(validate: Callable[..., Any]) -> None:
    spec = "{hosts: [a.com], http: [{$R}, {match: [{uri: {exact: /a}}, {uri: {exact: /b}}], $R}]}"
    assert validate(VS, spec).warnings == [
        "virtualService rule #1 not used (route without matches defined before)",
        "virtualService rule #1 not used (route without matches defined before)",
    ]
