"""String matches, regular expressions, and HTTP header names and values.

Regular expressions are checked with RE2 (the google-re2 package), the engine
Envoy runs them with: Python's ``re`` accepts look-arounds and backreferences
that Envoy would reject, and rejects some RE2 syntax.
"""

from __future__ import annotations

import re
from typing import Any

import re2  # type: ignore[import-untyped]

from meshpilot.config.validation.formatting import go_quote

# RFC 7230 token characters. "+-." is a range here (as in istiod's regex),
# which also admits ",".
_HEADER_NAME = re.compile(r"[!#$%&'*+-.^_`|~A-Za-z0-9]+")
_STRICT_HEADER_NAME = re.compile(r"[-_A-Za-z0-9]+")
_HEADER_VALUE = re.compile(r"[^\x00-\x08\x0A-\x1F\x7F]*")
_PSEUDO_HEADERS = frozenset({":method", ":scheme", ":authority", ":path", ":status"})
_JWT_CLAIM_PREFIX = "@request.auth.claims"
_MAX_REGEX_BYTES = 1024
_RE2_HINT = "Istio uses RE2 style regex-based match (https://github.com/google/re2/wiki/Syntax)"

_RE2_OPTIONS = re2.Options()
# Invalid patterns are an expected outcome here, not something to log.
_RE2_OPTIONS.log_errors = False

# RE2's C++ error codes, worded as Go's regexp/syntax words them in istiod's messages.
_RE2_TO_GO = {
    "missing )": "missing closing )",
    "missing ]": "missing closing ]",
    "trailing \\": "trailing backslash at end of expression",
    "no argument for repetition operator": "missing argument to repetition operator",
    "invalid repetition size": "invalid repeat count",
    "bad repetition operator": "invalid nested repetition operator",
    "invalid perl operator": "invalid or unsupported Perl syntax",
    "invalid named capture group": "invalid named capture",
    "pattern too large - compile failed": "expression too large",
}


def is_jwt_routing_claim(name: str) -> bool:
    """``@request.auth.claims.a.b`` or ``@request.auth.claims[a][b]`` (prefix case-insensitive)."""
    if not name.lower().startswith(_JWT_CLAIM_PREFIX):
        return False
    rest = name[len(_JWT_CLAIM_PREFIX) :]
    if rest.startswith(".") and len(rest) > 1:
        return True
    return rest.startswith("[") and rest.endswith("]") and len(rest) > 2


def validate_strict_header_name(name: str) -> str | None:
    """Letters, digits, ``-`` and ``_`` only (RequestAuthentication output headers)."""
    if not name:
        return "header name cannot be empty"
    if _STRICT_HEADER_NAME.fullmatch(name) is None:
        return f"header name {name} is not a valid header name"
    return None


def validate_cors_header_name(name: str) -> str | None:
    """A token, or ``*``."""
    if not name:
        return "header name cannot be empty"
    if name != "*" and _HEADER_NAME.fullmatch(name) is None:
        return f"header name {name} is not a valid header name"
    return None


def validate_header_name_or_jwt_claim(name: str) -> str | None:
    """A header to match on: a token, an HTTP/2 pseudo header, or a JWT claim route."""
    if not name:
        return "header name cannot be empty"
    if is_jwt_routing_claim(name) or name in _PSEUDO_HEADERS:
        return None
    if _HEADER_NAME.fullmatch(name) is None:
        return f"header name {name} is not a valid header name"
    return None


def is_authority_header(name: str) -> bool:
    """``:authority`` or ``host``, in any case."""
    return name.lower() in (":authority", "host")


def _is_internal_header(name: str) -> bool:
    return name.startswith(":") or name.lower() == "host"


def validate_header_with_authority_operation_name(name: str) -> str | None:
    """A request header to add or set: pseudo headers are refused, except the authority."""
    if not name:
        return "header name cannot be empty"
    if _is_internal_header(name) and not is_authority_header(name):
        return f'invalid header {go_quote(name)}: header cannot have ":" prefix'
    return None


def validate_header_operation_name(name: str) -> str | None:
    """A request header to remove, or a response header to add, set or remove."""
    if not name:
        return "header name cannot be empty"
    if name.lower() == "host":
        return f"invalid header {go_quote(name)}: cannot set Host header"
    if name.startswith(":"):
        return f'invalid header {go_quote(name)}: header cannot have ":" prefix'
    return None


def validate_header_value(value: str) -> str | None:
    """A header value: no control characters, and well-formed Envoy ``%VARIABLE%`` expressions."""
    if _HEADER_VALUE.fullmatch(value) is None:
        return f"header value configuration {value} is invalid"
    problem = _envoy_format_error(value)
    return f"header value configuration: {problem}" if problem else None


# States of Envoy's header-value formatter parser (router/header_parser.cc).
_LITERAL, _VAR_NAME, _EXPECT_ARRAY, _EXPECT_STRING, _STRING, _EXPECT_DELIM_OR_END = range(6)
_EXPECT_ARGS_END, _EXPECT_VAR_END = 6, 7
_BAD = "invalid header configuration. "


def _envoy_format_error(value: str) -> str | None:
    """Where Envoy's parser would reject ``value``, the reason; a port of its state machine."""
    data = value.encode()
    state = _LITERAL
    pos = 0
    while pos < len(data):
        ch = chr(data[pos])
        has_next = pos + 1 < len(data)
        if state == _LITERAL:
            if ch == "%":
                if not has_next:
                    return _BAD + "Un-escaped %"
                if chr(data[pos + 1]) == "%":
                    pos += 1  # "%%" is a literal percent sign
                else:
                    state = _VAR_NAME
        elif state == _VAR_NAME:
            if ch == "%":
                state = _LITERAL
            elif ch == "(":
                state = _EXPECT_ARRAY
        elif state == _EXPECT_ARRAY:
            if ch == "[":
                state = _EXPECT_STRING
            elif ch != " ":
                state = _STRING
        elif state == _EXPECT_DELIM_OR_END:
            if ch == ",":
                state = _EXPECT_STRING
            elif ch == "]":
                state = _EXPECT_ARGS_END
            elif ch != " ":
                return _BAD + "Expecting ',', ']', or whitespace"
        elif state == _EXPECT_STRING:
            if ch == '"':
                state = _STRING
            elif ch != " ":
                return _BAD + "Expecting '\"'"
        elif state == _STRING:
            if ch == "\\":
                if not has_next:
                    return _BAD + "Un-terminated backslash in JSON string"
                pos += 1
            elif ch == ")":
                state = _EXPECT_VAR_END
            elif ch == '"':
                state = _EXPECT_DELIM_OR_END
        elif state == _EXPECT_ARGS_END:
            if ch == ")":
                state = _EXPECT_VAR_END
            elif ch != " ":
                # Envoy's own message carries literal "{}" placeholders.
                return _BAD + "Expecting ')' or whitespace after '{}', but found '{}'"
        elif state == _EXPECT_VAR_END:
            if ch == "%":
                state = _LITERAL
            elif ch != " ":
                return _BAD + "Expecting '%' or whitespace after"
        pos += 1
    if state != _LITERAL:
        return _BAD + f"Un-terminated variable expression '{value}'"
    return None


def _re2_error_text(pattern: str, err: Exception) -> str:
    raw = err.args[0] if err.args else str(err)
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    code, sep, arg = text.partition(": ")
    if not sep:
        code, arg = text, ""
    code = _RE2_TO_GO.get(code, code)
    return f"error parsing regexp: {code}: `{arg}`"


def regex_error(pattern: str) -> str | None:
    """Why RE2 rejects ``pattern`` (worded like Go's regexp errors), or None."""
    try:
        re2.compile(pattern, options=_RE2_OPTIONS)
    except re2.error as err:
        return _re2_error_text(pattern, err)
    return None


def validate_string_regexp(pattern: str, where: str) -> str | None:
    """A regex Envoy can compile: RE2 syntax and at most 1024 bytes."""
    # Envoy limits RE2 program size; the length is istiod's stand-in for it.
    if len(pattern.encode()) > _MAX_REGEX_BYTES:
        return f"{go_quote(where)}: regex is too large, max length allowed is {_MAX_REGEX_BYTES}"
    problem = regex_error(pattern)
    if problem:
        return f"{go_quote(where)}: {problem}; {_RE2_HINT}"
    return None


def validate_string_match_regexp(match: Any, where: str) -> str | None:
    """The regex of a StringMatch, when it is a regex match."""
    if match.WhichOneof("match_type") != "regex":
        return None
    if not match.regex:
        return f"{go_quote(where)}: regex string match should not be empty"
    return validate_string_regexp(match.regex, where)


def validate_string_match(match: Any, where: str) -> str | None:
    """A StringMatch: a prefix must not be empty, a regex must compile; exact may be anything."""
    kind = match.WhichOneof("match_type")
    if kind == "prefix" and not match.prefix:
        return f"{go_quote(where)}: prefix string match should not be empty"
    if kind == "regex":
        return validate_string_match_regexp(match, where)
    return None
