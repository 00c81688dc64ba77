"""The shared checks: Go-compatible parsing and formatting, hostnames, IPs, headers, regexes."""

from __future__ import annotations

import pytest

from meshpilot.config.validation import goparse, hosts, matches
from meshpilot.config.validation.formatting import go_duration, go_float, go_quote
from meshpilot.config.validation.selectors import label_map_errors
from meshpilot.config.validation.visibility import export_to_errors


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (150.0, "150"),
        (0.5, "0.5"),
        (1e-05, "1e-05"),
        (0.0001, "0.0001"),
        (-3.0, "-3"),
        (1e20, "100000000000000000000"),
        (1e21, "1e+21"),
        (123.456, "123.456"),
    ],
)
def test_go_float(value: float, text: str) -> None:
    assert go_float(value) == text


@pytest.mark.parametrize(
    ("nanos", "text"),
    [
        (0, "0s"),
        (1, "1ns"),
        (1_500, "1.5µs"),
        (1_000_000, "1ms"),
        (1_500_000_000, "1.5s"),
        (61_000_000_000, "1m1s"),
        (3_600_000_000_000, "1h0m0s"),
        (-2_000_000, "-2ms"),
    ],
)
def test_go_duration(nanos: int, text: str) -> None:
    assert go_duration(nanos) == text


def test_go_quote_escapes_like_strconv_quote() -> None:
    assert go_quote('a"b\\c') == '"a\\"b\\\\c"'
    assert go_quote("tab\there\x01") == '"tab\\there\\x01"'
    assert go_quote("héllo") == '"héllo"'
    assert go_quote("\u00a0") == '"\\u00a0"'


@pytest.mark.parametrize(
    "address", ["1.2.3.4", "::", "::1", "2001:db8::1", "fe80::1%eth0", "::ffff:1.2.3.4", "1:2:3:4:5:6:7:8"]
)
def test_ip_addresses_accepted(address: str) -> None:
    assert goparse.is_ip_address(address)


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("01.2.3.4", "IPv4 field has octet with leading zero"),
        ("256.1.1.1", "IPv4 field has value >255"),
        ("1.2.3", "IPv4 address too short"),
        ("1.2.3.4.5", "IPv4 address too long"),
        ("1.2.3.4/8", 'unexpected character (at "/8")'),
        ("foo", "unable to parse IP"),
        ("%eth0", "missing IPv6 address"),
        ("fe80::1%", "zone must be a non-empty string"),
        ("1::2::3", 'multiple :: in address (at ":3")'),
        ("12345::", 'each group must have 4 or less digits (at "12345::")'),
        ("1:2:3:4:5:6:7", "address string too short"),
    ],
)
def test_ip_addresses_rejected_with_go_reason(address: str, reason: str) -> None:
    with pytest.raises(goparse.GoParseError) as err:
        goparse.parse_addr(address)
    assert str(err.value) == f"ParseAddr({go_quote(address)}): {reason}"


@pytest.mark.parametrize(
    ("prefix", "reason"),
    [
        ("1.2.3.4/33", "prefix length out of range"),
        ("1.2.3.4/08", 'bad bits after slash: "08"'),
        ("1.2.3.4/-1", 'bad bits after slash: "-1"'),
        ("fe80::1%eth0/64", "IPv6 zones cannot be present in a prefix"),
        ("foo/24", 'ParseAddr("foo"): unable to parse IP'),
    ],
)
def test_prefix_rejected_with_go_reason(prefix: str, reason: str) -> None:
    with pytest.raises(goparse.GoParseError) as err:
        goparse.parse_prefix(prefix)
    assert str(err.value) == f"netip.ParsePrefix({go_quote(prefix)}): {reason}"


def test_prefix_accepts_host_bits_and_ipv6() -> None:
    goparse.parse_prefix("1.2.3.4/16")
    goparse.parse_prefix("2001:db8::/128")
    goparse.parse_prefix("0.0.0.0/0")


@pytest.mark.parametrize(
    ("hostport", "expected"),
    [
        ("127.0.0.1:80", ("127.0.0.1", "80")),
        ("[::1]:80", ("::1", "80")),
        (":80", ("", "80")),
        ("host:", ("host", "")),
    ],
)
def test_split_host_port(hostport: str, expected: tuple[str, str]) -> None:
    assert goparse.split_host_port(hostport) == expected


@pytest.mark.parametrize(
    ("hostport", "reason"),
    [
        ("foo", "address foo: missing port in address"),
        ("::1:80", "address ::1:80: too many colons in address"),
        ("[::1]80", "address [::1]80: missing port in address"),
        ("[::1", "address [::1: missing ']' in address"),
    ],
)
def test_split_host_port_errors(hostport: str, reason: str) -> None:
    with pytest.raises(goparse.GoParseError) as err:
        goparse.split_host_port(hostport)
    assert str(err.value) == reason


def test_atoi_follows_go() -> None:
    assert goparse.atoi("+42") == 42
    assert goparse.atoi("-7") == -7
    for bad in ("", "4 2", "1_000", "0x10"):
        assert not goparse.is_atoi(bad)
    with pytest.raises(goparse.GoParseError, match="value out of range"):
        goparse.atoi("99999999999999999999")


@pytest.mark.parametrize(
    "value", ["1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False"]
)
def test_parse_bool_accepts_go_values(value: str) -> None:
    goparse.parse_bool(value)


@pytest.mark.parametrize("value", ["yes", "no", "tRuE", "", "on"])
def test_parse_bool_rejects_others(value: str) -> None:
    with pytest.raises(goparse.GoParseError):
        goparse.parse_bool(value)


@pytest.mark.parametrize(
    ("label", "ok"),
    [
        ("foo", True),
        ("Foo-1", True),
        ("a" * 63, True),
        ("a" * 64, False),
        ("-a", False),
        ("a.b", False),
        ("", False),
    ],
)
def test_dns1123_label(label: str, ok: bool) -> None:
    assert hosts.is_dns1123_label(label) is ok


@pytest.mark.parametrize(
    ("label", "ok"),
    [("*", True), ("foo", True), ("*foo", True), ("*-foo", True), ("foo*", False), ("**", False)],
)
def test_wildcard_dns1123_label(label: str, ok: bool) -> None:
    assert hosts.is_wildcard_dns1123_label(label) is ok


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("reviews", None),
        ("foo.com.", None),
        ("*.foo.com", None),
        ("*", None),
        ("*foo.com", None),
        ("", "empty domain name not allowed"),
        ("1.2.3.4", 'domain name "2.3.4" invalid (top level domain "4" cannot be all-numeric)'),
        ("foo.-1", 'domain name "-1" invalid (top level domain "-1" cannot be all-numeric)'),
        ("foo..com", 'domain name ".com" invalid (label "" invalid)'),
        ("fo*o.com", 'domain name "fo*o.com" invalid (label "fo*o" invalid)'),
        ("a" * 256, f'domain name "{"a" * 256}" too long (max 255)'),
    ],
)
def test_wildcard_domain(name: str, error: str | None) -> None:
    assert hosts.validate_wildcard_domain(name) == error


def test_fqdn_rejects_wildcards_and_ips() -> None:
    assert hosts.validate_fqdn("mesh") is None
    assert hosts.validate_fqdn("*.foo.com") == 'domain name "*.foo.com" invalid (label "*" invalid)'
    assert (
        hosts.validate_fqdn("10.0.0.1")
        == 'domain name "10.0.0.1" invalid (top level domain "1" cannot be all-numeric)'
    )


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("outbound_.80_._.e2e.foobar.mesh", None),
        (
            "outbound_.80_.e2e",
            "domain name outbound_.80_.e2e invalid, should follow 'outbound_.<PORT>_._.<HOSTNAME>' format",
        ),
        (
            "outbound_.x_._.foo",
            'domain name "outbound_.x_._.foo" invalid (label "x" invalid). '
            "should follow outbound_.<PORT>_._.<HOSTNAME> format",
        ),
        (
            "outbound_.80_._.123",
            'domain name "outbound_.80_._.123" invalid (label "123" invalid). '
            "should follow outbound_.<PORT>_._.<HOSTNAME> format",
        ),
    ],
)
def test_sni_outbound_names(name: str, error: str | None) -> None:
    assert hosts.validate_wildcard_domain_for_gateway_vs(True, name) == error


def test_sni_outbound_names_only_for_sni() -> None:
    assert hosts.validate_wildcard_domain_for_gateway_vs(False, "outbound_.80_._.e2e.foobar.mesh") is not None


def test_host_matches_and_subset() -> None:
    assert hosts.host_matches("*.foo.bar", "*.bar")
    assert hosts.host_matches("a.com", "a.com")
    assert hosts.host_matches("*.com", "a.com")
    assert not hosts.host_matches("a.com", "b.com")
    assert hosts.host_subset_of("a.foo.com", "*.foo.com")
    assert hosts.host_subset_of("*.a.foo.com", "*.foo.com")
    assert not hosts.host_subset_of("*.foo.com", "*.a.foo.com")
    assert not hosts.host_subset_of("*.foo.com", "a.foo.com")


@pytest.mark.parametrize(
    ("subnet", "error"),
    [
        ("1.2.3.4/16", None),
        ("2001:db8::/32", None),
        ("1.2.3.4", None),
        ("1.2.3.4/33", "1.2.3.4/33 is not a valid CIDR block"),
        ("1.2.3.4/8/8", "1.2.3.4/8/8 is not a valid IP"),
        ("foo", "foo is not a valid IP"),
    ],
)
def test_ip_subnet(subnet: str, error: str | None) -> None:
    assert hosts.validate_ip_subnet(subnet) == error


def test_protocols() -> None:
    assert hosts.parse_protocol("grpc-web") == "GRPC-Web"
    assert hosts.parse_protocol("HBONE") == hosts.UNSUPPORTED_PROTOCOL
    assert hosts.validate_protocol("") is None
    assert hosts.validate_protocol("udp") is None
    assert hosts.validate_protocol("quic") == "unsupported protocol: quic"
    assert hosts.is_tcp_protocol("Mongo") and not hosts.is_tcp_protocol("HTTP")


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("@abstract", None),
        ("/var/run/x.sock", None),
        ("", "unix address must not be empty"),
        ("relative.sock", "relative.sock is not an absolute path to a file"),
        ("/var/run/", "/var/run/ is not an absolute path to a file"),
    ],
)
def test_unix_address(path: str, error: str | None) -> None:
    assert hosts.validate_unix_address(path) == error


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("foo", None),
        ("%HOSTNAME%", None),
        ("100%%", None),
        ("prefix %HOSTNAME% suffix", None),
        ("%DOWNSTREAM_PEER_CERT_V_END(%b %d %H:%M:%S %Y %Z)%", None),
        ('%REQ(["x-a", "x-b"])%', None),
        ("%START_TIME%%", "header value configuration: invalid header configuration. Un-escaped %"),
        (
            "abc%123",
            "header value configuration: invalid header configuration. Un-terminated variable expression "
            "'abc%123'",
        ),
        (
            '%REQ(["a" x])%',
            "header value configuration: invalid header configuration. Expecting ',', ']', or whitespace",
        ),
        ("%REQ([x])%", "header value configuration: invalid header configuration. Expecting '\"'"),
        (
            '%REQ(["a"] x)%',
            "header value configuration: invalid header configuration. "
            "Expecting ')' or whitespace after '{}', but found '{}'",
        ),
        (
            "%REQ(a) x",
            "header value configuration: invalid header configuration. Expecting '%' or whitespace after",
        ),
        ("bad\nvalue", "header value configuration bad\nvalue is invalid"),
    ],
)
def test_header_value(value: str, error: str | None) -> None:
    assert matches.validate_header_value(value) == error


def test_header_names() -> None:
    assert matches.validate_header_name_or_jwt_claim("x,y") is None  # the token class admits ","
    assert matches.validate_header_name_or_jwt_claim(":path") is None
    assert matches.validate_header_name_or_jwt_claim("@request.auth.claims[a][b]") is None
    assert matches.validate_header_name_or_jwt_claim("x y") == "header name x y is not a valid header name"
    assert matches.validate_header_name_or_jwt_claim("") == "header name cannot be empty"
    assert matches.validate_strict_header_name("x.y") == "header name x.y is not a valid header name"
    assert matches.validate_cors_header_name("*") is None
    assert matches.validate_header_with_authority_operation_name("Host") is None
    assert matches.validate_header_with_authority_operation_name(":authority") is None
    assert (
        matches.validate_header_operation_name(":authority")
        == 'invalid header ":authority": header cannot have ":" prefix'
    )
    assert matches.validate_header_operation_name("a b") is None


@pytest.mark.parametrize(
    ("name", "is_claim"),
    [
        ("@request.auth.claims.sub", True),
        ("@REQUEST.AUTH.CLAIMS.sub", True),
        ("@request.auth.claims[a]", True),
        ("@request.auth.claims.", False),
        ("@request.auth.claims[]", False),
        ("@request.auth.claims", False),
    ],
)
def test_jwt_routing_claim(name: str, is_claim: bool) -> None:
    assert matches.is_jwt_routing_claim(name) is is_claim


@pytest.mark.parametrize("pattern", [r"^/api/v\d+/.*$", "(?i)abc", "(?P<name>x)", r"\pL+", "[[:alpha:]]"])
def test_re2_accepts(pattern: str) -> None:
    assert matches.regex_error(pattern) is None


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        # Python's re accepts these, Envoy's RE2 does not.
        ("a(?=b)", "error parsing regexp: invalid or unsupported Perl syntax: `(?=`"),
        (r"(a)\1", "error parsing regexp: invalid escape sequence: `\\1`"),
        ("a**", "error parsing regexp: invalid nested repetition operator: `**`"),
        ("x{1001}", "error parsing regexp: invalid repeat count: `{1001}`"),
        ("[a", "error parsing regexp: missing closing ]: `[a`"),
        ("a)", "error parsing regexp: unexpected ): `a)`"),
    ],
)
def test_re2_rejects(pattern: str, reason: str) -> None:
    assert matches.regex_error(pattern) == reason


def test_regex_length_limit_counts_bytes() -> None:
    assert matches.validate_string_regexp("a" * 1024, "uri") is None
    assert (
        matches.validate_string_regexp("é" * 513, "uri")
        == '"uri": regex is too large, max length allowed is 1024'
    )


def test_label_maps() -> None:
    assert label_map_errors({"app": "x", "example.com/name": "y", "a": ""}) == []
    assert label_map_errors({"a": "b c"}) == ['invalid tag value: "b c"']
    assert label_map_errors({"a/b/c": "x"}) == ['invalid tag key: "a/b/c"']
    assert label_map_errors({"k" * 64: "x"}) == [f'invalid tag key: "{"k" * 64}" (name is too long)']
    # Unlike Kubernetes, the value has no length limit.
    assert label_map_errors({"a": "v" * 100}) == []


def test_export_to() -> None:
    assert export_to_errors("ns", [".", "*"]) == [
        "cannot have both public (*) and non-public exportTo values for a resource"
    ]
    assert export_to_errors("ns", ["ns", "."]) == [
        "duplicate entries in exportTo: . and current namespace ns"
    ]
    assert export_to_errors("ns", ["Bad_NS"]) == [
        "only .,*, or a valid DNS 1123 label is allowed as exportTo entry"
    ]
    assert export_to_errors("ns", ["~"], is_service_entry=True) == []
    assert export_to_errors("ns", ["~", "a"], is_service_entry=True) == [
        "cannot export service entry to no one (~) and someone"
    ]
    assert export_to_errors("ns", [".", "other"], is_dr_with_selector=True) == [
        "destination rule with workload selector cannot have multiple entries in exportTo"
    ]
