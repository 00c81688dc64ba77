"""VirtualService match conditions as Envoy RouteMatch, header and query matchers."""

from __future__ import annotations

from typing import Any

from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.type.matcher.v3 import regex_pb2, string_pb2

from meshpilot.networking.protobuf import boolean


def string_matcher(match: Any) -> Any | None:
    which = match.WhichOneof("match_type")
    if which == "exact":
        return string_pb2.StringMatcher(exact=match.exact)
    if which == "prefix":
        return string_pb2.StringMatcher(prefix=match.prefix)
    if which == "regex":
        return string_pb2.StringMatcher(safe_regex=regex_pb2.RegexMatcher(regex=match.regex))
    return None


def _presence_only(match: Any | None) -> bool:
    """An empty match or the regex ``*`` means "present", as istiod reads it."""
    if match is None or match.WhichOneof("match_type") is None:
        return True
    return bool(match.WhichOneof("match_type") == "regex" and match.regex == "*")


def header_matcher(name: str, match: Any | None) -> Any:
    out = rc.HeaderMatcher(name=name)
    if _presence_only(match):
        out.present_match = True
    else:
        matcher = string_matcher(match)
        if matcher is not None:
            out.string_match.CopyFrom(matcher)
    return out


def route_match(match: Any | None) -> Any:
    out = rc.RouteMatch(prefix="/")
    if match is None:
        return out
    headers = [header_matcher(name, m) for name, m in match.headers.items()]
    for name, m in match.without_headers.items():
        matcher = header_matcher(name, m)
        matcher.invert_match = True
        if not _presence_only(m):
            matcher.treat_missing_header_as_empty = True
        headers.append(matcher)
    headers.sort(key=lambda h: h.name)
    out.headers.extend(headers)
    if match.HasField("uri"):
        which = match.uri.WhichOneof("match_type")
        if which == "exact":
            out.path = match.uri.exact
        elif which == "prefix":
            out.prefix = match.uri.prefix
        elif which == "regex":
            out.safe_regex.regex = match.uri.regex
    out.case_sensitive.CopyFrom(boolean(not match.ignore_uri_case))
    for pseudo, field in ((":method", "method"), (":authority", "authority"), (":scheme", "scheme")):
        if match.HasField(field):
            out.headers.append(header_matcher(pseudo, getattr(match, field)))
    for name in sorted(match.query_params):
        m = match.query_params[name]
        qp = rc.QueryParameterMatcher(name=name)
        if _presence_only(m):
            qp.present_match = True
        else:
            matcher = string_matcher(m)
            if matcher is not None:
                qp.string_match.CopyFrom(matcher)
        out.query_parameters.append(qp)
    return out


def is_catch_all(route: Any) -> bool:
    match = route.match
    which = match.WhichOneof("path_specifier")
    catch_all = (which == "prefix" and match.prefix == "/") or (
        which == "safe_regex" and match.safe_regex.regex == ".*"
    )
    return catch_all and not match.headers and not match.query_parameters and not match.dynamic_metadata
