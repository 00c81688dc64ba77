"""The matchers of istiod's authz model (``security/authz/matcher``): strings, headers, JWT claims
in dynamic metadata, CIDRs, and the bracketed names of ``when`` keys, with istiod's regex quoting.

A value that cannot become a matcher on the chain being built raises ``Skip``; ``authz_rule`` decides,
as istiod does, whether that drops the field or the whole rule.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any

from envoy.config.core.v3 import address_pb2
from envoy.config.route.v3 import route_components_pb2
from envoy.type.matcher.v3 import metadata_pb2, regex_pb2, string_pb2, value_pb2

JWT_FILTER = "envoy.filters.http.jwt_authn"
#: Where the JWT filter puts a verified token's payload in dynamic metadata.
JWT_PAYLOAD = "payload"
SPIFFE = "spiffe://"


#: What Go's regexp.QuoteMeta escapes (istiod's quoting): the same regex text as istiod's, where Python's
#: re.escape would also escape "-", "#", "~" and others.
_GO_META = frozenset("\\.+*?()|[]{}^$")


def quote_meta(text: str) -> str:
    return "".join("\\" + c if c in _GO_META else c for c in text)


class Skip(Exception):
    """A value that cannot be turned into a matcher on this chain."""


# -- string and header matchers (istiod's authz/matcher) ------------------------------------------


def regex_matcher(regex: str) -> Any:
    return string_pb2.StringMatcher(safe_regex=regex_pb2.RegexMatcher(regex=regex))


def string_matcher(value: str, prefix: str = "") -> Any:
    """``*`` any (``.+``), ``*x`` suffix, ``x*`` prefix, else exact; ``prefix`` is prepended."""
    if value == "*":
        return regex_matcher(".+")
    if value.startswith("*"):
        if not prefix:
            return string_pb2.StringMatcher(suffix=value[1:])
        return regex_matcher(prefix + ".*" + quote_meta(value[1:]))
    if value.endswith("*"):
        return string_pb2.StringMatcher(prefix=prefix + value[:-1])
    return string_pb2.StringMatcher(exact=prefix + value)


def header_matcher(name: str, value: str, *, ignore_case: bool = False) -> Any:
    out = route_components_pb2.HeaderMatcher(name=name)
    if value == "*":
        out.present_match = True
    elif value.startswith("*"):
        out.string_match.CopyFrom(string_pb2.StringMatcher(suffix=value[1:], ignore_case=ignore_case))
    elif value.endswith("*"):
        out.string_match.CopyFrom(string_pb2.StringMatcher(prefix=value[:-1], ignore_case=ignore_case))
    else:
        out.string_match.CopyFrom(string_pb2.StringMatcher(exact=value, ignore_case=ignore_case))
    return out


def value_or(values: Sequence[str]) -> Any:
    matchers = [value_pb2.ValueMatcher(string_match=string_matcher(v)) for v in values]
    if len(matchers) == 1:
        return matchers[0]
    return value_pb2.ValueMatcher(or_match=value_pb2.OrMatcher(value_matchers=matchers))


def metadata_matcher(filter_name: str, keys: Sequence[str], value: Any) -> Any:
    return metadata_pb2.MetadataMatcher(
        filter=filter_name,
        path=[metadata_pb2.MetadataMatcher.PathSegment(key=k) for k in keys],
        value=value,
    )


def jwt_claim_matcher(claims: Sequence[str], value: Any) -> Any:
    """A JWT payload claim holding ``value``, or a list containing it."""
    listed = value_pb2.ValueMatcher(list_match=value_pb2.ListMatcher(one_of=value))
    either = value_pb2.ValueMatcher(or_match=value_pb2.OrMatcher(value_matchers=[listed, value]))
    return metadata_matcher(JWT_FILTER, [JWT_PAYLOAD, *claims], either)


def jwt_claim_string(claim: str, matcher: Any) -> Any:
    return metadata_matcher(JWT_FILTER, [JWT_PAYLOAD, claim], value_pb2.ValueMatcher(string_match=matcher))


def cidr_range(value: str) -> Any:
    try:
        if "/" in value:
            net = ipaddress.ip_interface(value)
            ip, bits = str(net.ip), net.network.prefixlen
        else:
            addr = ipaddress.ip_address(value)
            ip, bits = str(addr), addr.max_prefixlen
    except ValueError as err:
        raise Skip(f"invalid address {value}: {err}") from None
    out = address_pb2.CidrRange(address_prefix=ip)
    out.prefix_len.value = bits
    return out


def names_in_brackets(text: str) -> list[str]:
    """``[a][b]`` → ``[a, b]``; ``[a.b]`` → ``[a.b]`` (istiod's extractNameInNestedBrackets)."""
    names: list[str] = []
    begin = 0
    while begin < len(text):
        end = -1
        if text[begin] == "[":
            for i in range(begin + 1, len(text)):
                if text[i] == "[":
                    break
                if text[i] == "]":
                    end = i
                    break
        if end == -1:
            return [name_in_brackets(text)]
        names.append(text[begin + 1 : end])
        begin = end + 1
    return names


def name_in_brackets(text: str) -> str:
    if not (text.startswith("[") and text.endswith("]")):
        raise Skip(f"expecting format [<NAME>], but found {text}")
    return text[1:-1]
