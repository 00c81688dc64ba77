"""The invalid/warning examples of the validation notes (§14), through decode_object.

Each row names the object and istiod's message. Errors are compared as sets
(istiod's order depends on Go map iteration); a row's warnings must all be
present.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

RE2_HINT = "; Istio uses RE2 style regex-based match (https://github.com/google/re2/wiki/Syntax)"


@dataclass(frozen=True)
class Case:
    row: int
    kind: str
    spec: str
    errors: frozenset[str] = frozenset()
    warnings: frozenset[str] = frozenset()
    meta: dict[str, Any] = field(default_factory=dict)


def case(
    row: int, kind: str, spec: str, *, e: tuple[str, ...] = (), w: tuple[str, ...] = (), **meta: Any
) -> Case:
    return Case(row, kind, spec, frozenset(e), frozenset(w), meta)


VS, DR, GW, SE, WE, SC = (
    "VirtualService",
    "DestinationRule",
    "Gateway",
    "ServiceEntry",
    "WorkloadEntry",
    "Sidecar",
)
PA, AP, RA = "PeerAuthentication", "AuthorizationPolicy", "RequestAuthentication"
HTTP80 = "{number: 80, name: http, protocol: HTTP}"
HTTPS443 = "{number: 443, name: https, protocol: HTTPS}"

CASES = [
    case(
        1,
        VS,
        "{hosts: ['*'], http: [{$R}]}",
        e=("wildcard host * is not allowed for virtual services bound to the mesh gateway",),
    ),
    case(2, VS, "{hosts: [foo.bar]}", e=("http, tcp or tls must be provided in virtual service",)),
    case(
        3,
        VS,
        "{hosts: ['*.foo.bar', '*.bar'], http: [{$R}]}",
        e=("duplicate hosts in virtual service: *.foo.bar & *.bar",),
    ),
    case(
        4, VS, "{hosts: ['foo.ba!r'], http: [{$R}]}", e=('domain name "ba!r" invalid (label "ba!r" invalid)',)
    ),
    case(
        5,
        VS,
        "{gateways: [ns1/gw], http: [{$R}]}",
        e=("delegate virtual service must have no gateways specified",),
    ),
    case(
        6,
        VS,
        "{hosts: [foo.bar], gateways: ['ns1/*'], http: [{$R}]}",
        e=('invalid value for gateway name: "*"',),
    ),
    case(
        7,
        VS,
        "{hosts: [foo.bar], gateways: [gw.example.com], http: [{$R}]}",
        w=(
            'using legacy gatewayName format "gw.example.com"; prefer the <namespace>/<name> format: '
            '"example/gw"',
        ),
    ),
    case(
        8,
        VS,
        "{hosts: [foo.bar], http: [{match: [{uri: {prefix: /}}]}]}",
        e=("HTTP route, redirect or direct_response is required",),
    ),
    case(
        9,
        VS,
        "{hosts: [foo.bar], http: [{route: [{destination: {host: '*'}}]}]}",
        e=("invalid destination host *",),
    ),
    case(
        10,
        VS,
        "{hosts: [foo.bar], http: [{route: [{destination: {host: a}, weight: -1}]}]}",
        e=("weight -1 < 0",),
    ),
    case(
        11,
        VS,
        "{hosts: [foo.bar], http: [{route: [{destination: {host: a}}, {destination: {host: b}}]}]}",
        e=("total destination weight = 0",),
    ),
    case(
        12, VS, "{hosts: [foo.bar], http: [{$R, timeout: 0.0005s}]}", e=("duration must be greater than 1ms",)
    ),
    case(
        13,
        VS,
        "{hosts: [foo.bar], http: [{$R, timeout: 1.0005s}]}",
        e=("only durations to ms precision are supported",),
    ),
    case(
        14,
        VS,
        "{hosts: [foo.bar], http: [{$R, retries: {attempts: 3, retryOn: '5xx,bogus'}}]}",
        e=('"bogus" is not a valid retryOn policy',),
    ),
    case(
        15,
        VS,
        "{hosts: [foo.bar], http: [{$R, retries: {attempts: 0, perTryTimeout: 1s}}]}",
        e=("http retry policy configured when attempts are set to 0 (disabled)",),
    ),
    case(
        16,
        VS,
        "{hosts: [foo.bar], http: [{$R, fault: {abort: {httpStatus: 700}}}]}",
        e=("HTTP status 700 is not in range 200-599",),
    ),
    case(
        17,
        VS,
        "{hosts: [foo.bar], http: [{$R, fault: {}}]}",
        e=("HTTP fault injection must have an abort and/or a delay",),
    ),
    case(
        18,
        VS,
        "{hosts: [foo.bar], http: [{$R, fault: {abort: {grpcStatus: NOPE}}}]}",
        e=(
            'gRPC status "NOPE" is not supported. See '
            "https://github.com/grpc/grpc/blob/master/doc/statuscodes.md "
            "for a list of supported codes, for example 'NOT_FOUND'",
        ),
    ),
    case(
        19,
        VS,
        "{hosts: [foo.bar], http: [{$R, fault: {delay: {fixedDelay: 1s, percentage: {value: 150}}}}]}",
        e=("percentage 150 is neither 0.0, nor in range [0.0001, 100.0]",),
    ),
    case(
        20,
        VS,
        "{hosts: [foo.bar], http: [{$R, mirror: {host: a}, mirrorPercent: 5}]}",
        w=('using deprecated setting "mirrorPercent", use "mirrorPercentage" instead',),
    ),
    case(
        21,
        VS,
        "{hosts: [foo.bar], http: [{redirect: {uri: /x, redirectCode: 200}}]}",
        e=("200 is not a valid redirect code, must be 3xx",),
    ),
    case(
        22,
        VS,
        "{hosts: [foo.bar], http: [{redirect: {scheme: ftp}}]}",
        e=('invalid redirect scheme, must be "http" or "https"',),
    ),
    case(
        23,
        VS,
        "{hosts: [foo.bar], http: [{$R, rewrite: {}}]}",
        e=(
            "rewrite must specify at least one of URI, UriRegexRewrite, or authority. "
            "Only one of URI or UriRegexRewrite may be specified",
        ),
    ),
    # Row 24 (the regex message) is checked by prefix and suffix below.
    case(
        25,
        VS,
        "{hosts: [foo.bar], http: [{$R, match: [{headers: {x-a: {prefix: ''}}}]}]}",
        e=('"headers": prefix string match should not be empty',),
    ),
    case(
        26,
        VS,
        "{hosts: [foo.bar], http: [{$R, headers: {request: {set: {':path': /x}}}}]}",
        e=('invalid header ":path": header cannot have ":" prefix',),
    ),
    case(
        27,
        VS,
        "{hosts: [foo.bar], http: [{$R, headers: {response: {remove: [Host]}}}]}",
        e=('invalid header "Host": cannot set Host header',),
    ),
    case(
        28,
        VS,
        "{hosts: [foo.bar], http: [{$R, headers: {request: {set: {x-a: 'abc%123'}}}}]}",
        e=(
            "header value configuration: invalid header configuration. Un-terminated variable expression "
            "'abc%123'",
        ),
    ),
    case(
        29,
        VS,
        "{hosts: [foo.bar], http: [{$R, corsPolicy: {allowMethods: [get]}}]}",
        e=('"get" is not a supported HTTP method',),
    ),
    case(
        30,
        VS,
        "{hosts: [foo.bar], http: [{$R, headers: {request: {set: {host: a}}}, rewrite: {authority: b}}]}",
        e=('authority header cannot be set multiple times: have "b", attempting to set "a"',),
    ),
    case(
        31,
        VS,
        "{hosts: [foo.bar], tls: [{match: [{sniHosts: [other.com]}], route: [{destination: {host: a}}]}]}",
        e=('SNI host "other.com" is not a compatible subset of any of the virtual service hosts: [foo.bar]',),
    ),
    case(
        32,
        VS,
        "{hosts: [foo.bar], tls: [{match: [{sniHosts: [1.1.1.1]}], route: [{destination: {host: a}}]}]}",
        w=('using an IP address ("1.1.1.1") goes against SNI spec and most clients do not support this',),
    ),
    case(33, VS, "{hosts: [foo.bar], tcp: [{match: [{port: 999}]}]}", e=("TCP route is required",)),
    case(
        34,
        VS,
        "{hosts: [foo.bar], gateways: [mesh], http: [{$R, match: [{headers: "
        "{'@request.auth.claims.foo': {exact: bar}}}]}]}",
        e=(
            "JWT claim based routing (key: @request.auth.claims.foo) is only supported for gateway, "
            "found no gateways: [mesh]",
        ),
    ),
    case(
        35,
        VS,
        "{hosts: [foo.bar], http: [{directResponse: {status: 100}}]}",
        e=("HTTP status 100 is not in range 200-599",),
    ),
    case(
        36,
        VS,
        "{hosts: [foo.bar], http: [{$R, mirror: {host: a}, mirrorPercentage: {value: 150}}]}",
        e=("mirror_percentage must have a max value of 100 (it has 150.000000)",),
    ),
    case(
        37,
        VS,
        "{hosts: [foo.bar], http: [{$R}, {$R}]}",
        w=("virtualService rule #1 not used (only the last rule can have no matches)",),
    ),
    case(
        38,
        VS,
        "{hosts: [foo.bar], http: [{$R, match: [{uri: {prefix: /api/v1/product}}, "
        "{uri: {prefix: /api/v1/products}, method: {exact: GET}}]}]}",
        w=(
            "virtualService rule #0 match #1 of prefix /api/v1/products is not used "
            "(duplicate/overlapping match in rule #0 of prefix /api/v1/product on #0)",
        ),
    ),
    case(
        39,
        VS,
        "{hosts: [foo.bar], exportTo: ['~'], http: [{$R}]}",
        e=("exportTo ~ (none) is not allowed for Istio configuration objects",),
    ),
    case(40, DR, "{host: ''}", e=("empty domain name not allowed",)),
    case(41, DR, "{host: r, subsets: [{name: v1}, {name: v1}]}", e=("duplicate subset names: v1",)),
    case(42, DR, "{host: r, subsets: [{name: v1.0}]}", e=("subset name is invalid: v1.0",)),
    case(43, DR, "{host: r, subsets: [{name: v1, labels: {'a b': x}}]}", e=('invalid tag key: "a b"',)),
    case(44, DR, "{host: r, trafficPolicy: {}}", e=("traffic policy must have at least one field",)),
    case(
        45,
        DR,
        "{host: r, trafficPolicy: {connectionPool: {}}}",
        e=("connection pool must have at least one field",),
    ),
    case(
        46,
        DR,
        "{host: r, trafficPolicy: {outlierDetection: {maxEjectionPercent: 120}}}",
        e=("percentage 120 is not in range 0..100",),
    ),
    case(
        47,
        DR,
        "{host: r, trafficPolicy: {loadBalancer: {consistentHash: {maglev: {tableSize: 4}}}}}",
        e=("tableSize must be a prime number for maglev",),
    ),
    case(
        48,
        DR,
        "{host: r, trafficPolicy: {loadBalancer: {localityLbSetting: {distribute: [{from: a/*, to: "
        "{b/*: 100}}], "
        "failover: [{from: a, to: b}]}}}}",
        e=("can not simultaneously specify 'distribute' and 'failover'",),
    ),
    case(
        49,
        DR,
        "{host: r, trafficPolicy: {tls: {mode: MUTUAL}}}",
        e=("client certificate required for mutual tls", "private key required for mutual tls"),
    ),
    case(
        50,
        DR,
        "{host: r, exportTo: ['.', '*']}",
        e=("cannot have both public (*) and non-public exportTo values for a resource",),
    ),
    case(
        51, DR, "{host: r, exportTo: ['.', default]}", e=("duplicate entries in exportTo for entry default",)
    ),
    case(
        52,
        DR,
        "{host: r, workloadSelector: {matchLabels: {app: a}}, exportTo: ['*']}",
        e=("destination rule with workload selector cannot have exportTo beyond current namespace",),
    ),
    case(
        53,
        DR,
        "{host: r, trafficPolicy: {tunnel: {protocol: GET, targetHost: foo.com, targetPort: 80}}}",
        e=('tunnel protocol must be "CONNECT" or "POST"',),
    ),
    case(
        54,
        DR,
        "{host: r, trafficPolicy: {outlierDetection: {consecutiveErrors: 5}}}",
        w=(
            "outlier detection consecutive errors is deprecated, use consecutiveGatewayErrors or "
            "consecutive5xxErrors instead",
        ),
    ),
    case(
        55,
        GW,
        f"{{servers: [{{port: {HTTP80}, hosts: ['*']}}]}}",
        e=('invalid gateway name: "my.gw"',),
        name="my.gw",
    ),
    case(56, GW, "{servers: []}", e=("gateway must have at least one server",)),
    case(
        57,
        GW,
        f"{{servers: [{{port: {HTTPS443}, hosts: ['*']}}]}}",
        e=("server must have TLS settings for HTTPS/TLS protocols",),
    ),
    case(
        58,
        GW,
        "{servers: [{port: {number: 80, name: p, protocol: FOO}, hosts: ['*']}]}",
        e=(
            'invalid protocol "FOO", supported protocols are HTTP, HTTP2, GRPC, GRPC-WEB, MONGO, REDIS, '
            "MYSQL, TCP",
        ),
    ),
    case(
        59,
        GW,
        f"{{servers: [{{port: {HTTP80}, hosts: [foo]}}]}}",
        e=("short names (non FQDN) are not allowed",),
    ),
    case(
        60,
        GW,
        f"{{servers: [{{port: {HTTP80}, hosts: ['*foo.com']}}]}}",
        e=('partial wildcard "*foo.com" not allowed',),
    ),
    case(
        61,
        GW,
        f"{{servers: [{{port: {HTTP80}, hosts: ['*']}}, "
        "{port: {number: 81, name: http, protocol: HTTP}, hosts: ['*']}]}",
        e=("port names in servers must be unique: duplicate name http",),
    ),
    case(
        62,
        GW,
        f"{{servers: [{{port: {HTTPS443}, hosts: ['*'], tls: {{mode: SIMPLE}}}}]}}",
        e=("SIMPLE TLS requires a server certificate", "SIMPLE TLS requires a private key"),
    ),
    case(
        63,
        GW,
        f"{{servers: [{{port: {HTTPS443}, hosts: ['*'], tls: {{mode: ISTIO_MUTUAL, credentialName: c}}}}]}}",
        e=("ISTIO_MUTUAL TLS cannot have associated credentialName",),
    ),
    case(
        64,
        GW,
        f"{{servers: [{{port: {HTTPS443}, hosts: ['*'], "
        "tls: {mode: MUTUAL, serverCertificate: /a, privateKey: /b}}]}",
        e=("MUTUAL TLS requires a client CA bundle",),
    ),
    case(
        65,
        GW,
        "{servers: [{port: {number: 80, name: http, protocol: HTTP, targetPort: 8080}, hosts: ['*']}]}",
        e=("targetPort has no impact on Gateways",),
    ),
    case(
        66,
        GW,
        "{servers: [{port: {number: 9000, name: tcp, protocol: TCP}, hosts: ['*'], tls: "
        "{httpsRedirect: true}}]}",
        e=("server cannot have TLS settings for non HTTPS/TLS ports",),
        w=("tls.httpsRedirect should only be used with http servers",),
    ),
    case(
        67,
        GW,
        f"{{servers: [{{port: {HTTPS443}, hosts: ['*'], "
        "tls: {mode: SIMPLE, credentialName: c, cipherSuites: [FOO-BAR]}}]}",
        w=("ignoring invalid cipher suites: [FOO-BAR]",),
    ),
    case(68, SE, "{hosts: []}", e=("service entry must have at least one host",)),
    case(69, SE, "{hosts: ['*']}", e=("invalid host *",)),
    case(
        70,
        SE,
        "{hosts: [a.com], addresses: [1.2.3.4/16], resolution: DNS}",
        e=("CIDR addresses are allowed only for NONE/STATIC resolution types",),
    ),
    case(
        71,
        SE,
        "{hosts: [a.com], ports: [{number: 80, name: a, protocol: HTTP}, {number: 80, name: b, "
        "protocol: HTTP}]}",
        e=("service entry port 80 already defined",),
    ),
    case(
        72,
        SE,
        "{hosts: [a.com], resolution: NONE, endpoints: [{address: 1.2.3.4}]}",
        e=("no endpoints should be provided for resolution type none",),
    ),
    case(
        73,
        SE,
        "{hosts: ['*.foo.com'], resolution: DNS, ports: [{number: 80, name: http, protocol: HTTP}]}",
        e=(
            "hosts must be FQDN or contain only prefix wildcards if no endpoints are provided for resolution "
            'mode DNS, domain name "*.foo.com" invalid (label "*" invalid)',
        ),
    ),
    case(
        74,
        SE,
        "{hosts: [a.com], resolution: STATIC, ports: [{number: 80, name: http, protocol: HTTP}], "
        "endpoints: [{address: foo.com}]}",
        e=('endpoint address "foo.com" is not a valid IP address',),
    ),
    case(
        75,
        SE,
        "{hosts: [a.com, b.com], resolution: DNS, ports: [{number: 9000, name: tcp, protocol: TCP}]}",
        e=("multiple hosts provided with non-HTTP, non-TLS ports",),
    ),
    case(
        76,
        SE,
        "{hosts: [a.com], ports: [{number: 80, name: '', protocol: FOO}]}",
        e=("invalid port name: ", "unsupported protocol: FOO"),
    ),
    case(77, SE, "{hosts: ['*foo.com'], resolution: NONE}", w=('partial wildcard "*foo.com" not allowed',)),
    case(
        78,
        SE,
        "{hosts: [a.com], workloadSelector: {labels: {app: '*'}}}",
        e=('wildcard is not supported in selector: "app=*"',),
    ),
    case(79, WE, "{}", e=("address is required",)),
    case(
        80,
        WE,
        "{address: 'unix://@foo', ports: {http: 80}}",
        e=("unix endpoint unix://@foo must not include ports",),
    ),
    case(
        81, WE, "{address: foo_bar}", e=('endpoint address "foo_bar" is not a valid FQDN or an IP address',)
    ),
    case(
        82,
        WE,
        "{address: 1.1.1.1, ports: {http: 99999}}",
        e=("port number 99999 must be in the range 1..65535",),
    ),
    case(83, WE, "{network: n1}", w=('address is unset with network "n1"',)),
    case(84, SC, "{}", e=("sidecar: empty configuration provided",)),
    case(85, SC, "{egress: [{hosts: [foo.com]}]}", e=("host must be of form namespace/dnsName",)),
    case(
        86,
        SC,
        "{egress: [{hosts: ['*/*']}, {port: {number: 80, protocol: HTTP, name: h}, hosts: ['*/*']}]}",
        e=("sidecar: the egress listener with empty port should be the last listener in the list",),
    ),
    case(
        87,
        SC,
        "{ingress: [{port: {number: 80, protocol: HTTP, name: h}, defaultEndpoint: '1.1.1.1:80'}]}",
        e=(
            "sidecar: defaultEndpoint must be of form 127.0.0.1:<port>,0.0.0.0:<port>,[::1]:port,[::]:port,"
            "unix://filepath or unset",
        ),
    ),
    case(
        88,
        SC,
        "{outboundTrafficPolicy: {mode: REGISTRY_ONLY, egressProxy: {host: foo.com, port: {number: 80}}}}",
        e=("sidecar: egress_proxy must be set only with ALLOW_ANY outbound_traffic_policy mode",),
    ),
    case(89, SC, "{egress: [{hosts: [ns1/a.com, ns1/a.com]}]}", w=("duplicated egress host: ns1/a.com",)),
    case(
        90,
        SC,
        "{workloadSelector: {}, egress: [{hosts: ['*/*']}]}",
        w=(
            "sidecar: workload selector specified without labels, will be applied to all services in "
            "namespace",
        ),
    ),
    case(
        91,
        PA,
        "{portLevelMtls: {'80': {mode: STRICT}}}",
        e=("mesh/namespace peer authentication cannot have port level mTLS",),
    ),
    case(
        92,
        PA,
        "{selector: {matchLabels: {app: a}}, portLevelMtls: {'0': {mode: STRICT}}}",
        e=("port must be in range 1..65535",),
    ),
    case(93, PA, "{selector: {}}", w=("workload selector specified without labels",)),
    case(
        94,
        AP,
        "{action: DENY}",
        e=(
            "invalid policy x.default: DENY action without `rules` is meaningless as it will never be "
            "triggered, "
            "add an empty rule `{}` if you want it be triggered for every request",
        ),
    ),
    case(
        95,
        AP,
        "{action: CUSTOM, rules: [{}]}",
        e=("invalid policy x.default: `provider.name` must not be empty",),
    ),
    case(
        96,
        AP,
        "{action: ALLOW, provider: {name: p}}",
        e=("invalid policy x.default: `provider` must not be with non CUSTOM action, found ALLOW",),
    ),
    case(
        97,
        AP,
        "{rules: [{from: [{source: {}}]}]}",
        e=("invalid policy x.default: `from.source` must not be empty, found at rule 0",),
    ),
    case(
        98,
        AP,
        "{rules: [{from: [{source: {serviceAccounts: [ns/sa], namespaces: [ns]}}]}]}",
        e=(
            "invalid policy x.default: cannot set serviceAccounts with namespaces or principals, found at "
            "rule 0",
        ),
    ),
    case(
        99,
        AP,
        "{rules: [{to: [{operation: {ports: ['99999']}}]}]}",
        e=("invalid policy x.default: bad port (99999): <nil>",),
    ),
    case(
        100,
        AP,
        "{rules: [{from: [{source: {ipBlocks: [foo]}}]}]}",
        e=("invalid policy x.default: bad IP address (foo)",),
    ),
    case(
        101,
        AP,
        "{rules: [{when: [{key: foo, values: [x]}]}]}",
        e=(
            "invalid policy x.default: invalid `value` for `key` foo: unknown attribute: foo",
            "invalid policy x.default: invalid `notValue` for `key` foo: unknown attribute: foo",
        ),
    ),
    case(
        102,
        AP,
        "{rules: [{to: [{operation: {paths: ['/a/{**}/b/{**}']}}]}]}",
        e=(
            "invalid policy x.default: invalid or unsupported path a/{**}/b/{**}, found in Paths. "
            "{**} is not the last operator",
        ),
    ),
    case(
        103,
        AP,
        "{selector: {matchLabels: {a: b}}, targetRef: {kind: Service, name: s}}",
        e=("invalid policy x.default: only one of targetRefs or workloadSelector can be set",),
    ),
    case(
        104,
        AP,
        "{targetRef: {kind: Pod, name: p}}",
        e=(
            "invalid policy x.default: targetRef must be to one of [core/v1/Service "
            "networking.istio.io/v1/ServiceEntry gateway.networking.k8s.io/v1/Gateway "
            "gateway.networking.k8s.io/v1/GatewayClass] but was /Pod",
        ),
    ),
    case(
        105,
        AP,
        "{action: DENY, rules: [{to: [{operation: {methods: [GET]}}]}]}",
        w=(
            "configured AuthorizationPolicy will deny all traffic to TCP ports under its scope due to the "
            "use "
            "of only HTTP attributes in a DENY rule; it is recommended to explicitly specify the port",
        ),
    ),
    case(
        106,
        AP,
        "{rules: [{}]}",
        e=(
            "default/x has annotation istio.io/dry-run with invalid value (yes): "
            'strconv.ParseBool: parsing "yes": invalid syntax',
        ),
        annotations={"istio.io/dry-run": "yes"},
    ),
    case(
        107,
        VS,
        "{hosts: [a.com], http: [{$R}]}",
        e=("default/x has unsupported annotation istio.io/dry-run, please remove the annotation",),
        annotations={"istio.io/dry-run": "true"},
    ),
    case(108, RA, "{jwtRules: [{}]}", e=("issuer or jwksUri must be non-empty string",)),
    case(
        109,
        RA,
        "{jwtRules: [{issuer: i, jwksUri: 'ftp://x/keys'}]}",
        e=('URI scheme "ftp" is not supported',),
    ),
    case(
        110,
        RA,
        "{jwtRules: [{issuer: i, outputClaimToHeaders: [{header: 'x y', claim: sub}]}]}",
        e=("header name x y is not a valid header name",),
    ),
]


@pytest.mark.parametrize("c", CASES, ids=[f"row{c.row}-{c.kind}" for c in CASES])
def test_reference_case(c: Case, validate: Callable[..., Any]) -> None:
    outcome = validate(c.kind, c.spec, **c.meta)
    assert set(outcome.errors) == c.errors
    assert c.warnings <= set(outcome.warnings)


def test_row24_regex_message(validate: Callable[..., Any]) -> None:
    outcome = validate(VS, "{hosts: [foo.bar], http: [{$R, match: [{uri: {regex: '('}}]}]}")
    assert len(outcome.errors) == 1
    assert outcome.errors[0].startswith('"uri": ')
    assert outcome.errors[0].endswith(RE2_HINT)
    # RE2's reason, reworded as Go's regexp package words it.
    assert outcome.errors[0] == '"uri": error parsing regexp: missing closing ): `(`' + RE2_HINT


# A valid object of each kind, for the rows that apply to "any kind".
ANY_KIND = {
    VS: "{hosts: [a.com], http: [{$R}]}",
    DR: "{host: r}",
    GW: f"{{servers: [{{port: {HTTP80}, hosts: ['*']}}]}}",
    SE: "{hosts: [a.com], ports: [{number: 80, name: http, protocol: HTTP}]}",
    WE: "{address: 1.2.3.4}",
    SC: "{egress: [{hosts: ['*/*']}]}",
    PA: "{mtls: {mode: STRICT}}",
    AP: "{rules: [{}]}",
    RA: "{jwtRules: [{issuer: i}]}",
}


@pytest.mark.parametrize("kind", sorted(ANY_KIND))
def test_any_kind_objects_are_valid_without_internal_annotations(
    kind: str, validate: Callable[..., Any]
) -> None:
    assert validate(kind, ANY_KIND[kind]).errors == []


@pytest.mark.parametrize("kind", sorted(ANY_KIND))
def test_row111_internal_parents_annotation(kind: str, validate: Callable[..., Any]) -> None:
    outcome = validate(kind, ANY_KIND[kind], annotations={"internal.istio.io/parents": "x"})
    assert outcome.errors == ['"internal.istio.io/parents" annotation found, this may not be set by users']


@pytest.mark.parametrize("kind", sorted(ANY_KIND))
def test_row112_always_reject_annotation(kind: str, validate: Callable[..., Any]) -> None:
    outcome = validate(kind, ANY_KIND[kind], annotations={"internal.istio.io/webhook-always-reject": ""})
    assert outcome.errors == ['"internal.istio.io/webhook-always-reject" annotation found, rejecting']
