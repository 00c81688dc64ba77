"""Go standard-library parsers whose accept/reject rules and error texts istiod passes through.

istiod validates IP addresses with net/netip, splits host:port with
net.SplitHostPort and reads integers with strconv, and several of its messages
embed those functions' error texts. Python's ipaddress and int() accept a
different set of inputs (and word their errors differently), so the parts
that matter are reimplemented here.
"""

from __future__ import annotations

from meshpilot.config.validation.formatting import go_quote

_INT64_MAX = 2**63 - 1
_INT64_MIN = -(2**63)


class GoParseError(ValueError):
    """A parse failure carrying Go's error text."""


# --- strconv -------------------------------------------------------------------------------------


def _digits_only(text: str) -> bool:
    return bool(text) and all("0" <= c <= "9" for c in text)


def atoi(text: str) -> int:
    """strconv.Atoi: an optional sign and decimal digits that fit in an int64."""
    body = text[1:] if text[:1] in ("+", "-") else text
    if not _digits_only(body):
        raise GoParseError(f"strconv.Atoi: parsing {go_quote(text)}: invalid syntax")
    value = int(text)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise GoParseError(f"strconv.Atoi: parsing {go_quote(text)}: value out of range")
    return value


def is_atoi(text: str) -> bool:
    """Whether strconv.Atoi accepts ``text``."""
    try:
        atoi(text)
    except GoParseError:
        return False
    return True


def parse_uint32(text: str) -> int:
    """strconv.ParseUint(text, 10, 32)."""
    if not _digits_only(text):
        raise GoParseError(f"strconv.ParseUint: parsing {go_quote(text)}: invalid syntax")
    value = int(text)
    if value > 2**32 - 1:
        raise GoParseError(f"strconv.ParseUint: parsing {go_quote(text)}: value out of range")
    return value


_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def parse_bool(text: str) -> bool:
    """strconv.ParseBool."""
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise GoParseError(f"strconv.ParseBool: parsing {go_quote(text)}: invalid syntax")


# --- net/netip -----------------------------------------------------------------------------------


def _addr_error(text: str, msg: str, at: str | None = None) -> GoParseError:
    suffix = f" (at {go_quote(at)})" if at is not None else ""
    return GoParseError(f"ParseAddr({go_quote(text)}): {msg}{suffix}")


def _parse_ipv4_fields(whole: str, part: str) -> None:
    value = 0
    digits = 0
    fields = 0
    for i, ch in enumerate(part):
        if "0" <= ch <= "9":
            if digits == 1 and value == 0:
                raise _addr_error(whole, "IPv4 field has octet with leading zero")
            value = value * 10 + ord(ch) - ord("0")
            digits += 1
            if value > 255:
                raise _addr_error(whole, "IPv4 field has value >255")
        elif ch == ".":
            if i == 0 or i == len(part) - 1 or part[i - 1] == ".":
                raise _addr_error(whole, "IPv4 field must have at least one digit", part[i:])
            if fields == 3:
                raise _addr_error(whole, "IPv4 address too long")
            fields += 1
            value = 0
            digits = 0
        else:
            raise _addr_error(whole, "unexpected character", part[i:])
    if fields < 3:
        raise _addr_error(whole, "IPv4 address too short")


def _hex_value(ch: str) -> int:
    if "0" <= ch <= "9":
        return ord(ch) - ord("0")
    if "a" <= ch <= "f":
        return ord(ch) - ord("a") + 10
    if "A" <= ch <= "F":
        return ord(ch) - ord("A") + 10
    return -1


def _parse_ipv6(whole: str) -> bool:
    """Parse an IPv6 address (optionally with a zone); returns whether it carried a zone."""
    rest = whole
    zone = ""
    if "%" in rest:
        rest, zone = rest.split("%", 1)
        if not zone:
            raise _addr_error(whole, "zone must be a non-empty string")
    filled = 0  # bytes of the 16 parsed so far
    ellipsis = -1
    if rest.startswith("::"):
        ellipsis = 0
        rest = rest[2:]
        if not rest:
            return bool(zone)
    while filled < 16:
        off = 0
        acc = 0
        while off < len(rest):
            digit = _hex_value(rest[off])
            if digit < 0:
                break
            acc = (acc << 4) + digit
            if off > 3:
                raise _addr_error(whole, "each group must have 4 or less digits", rest)
            if acc > 0xFFFF:
                raise _addr_error(whole, "IPv6 field has value >=2^16", rest)
            off += 1
        if off == 0:
            raise _addr_error(whole, "each colon-separated field must have at least one digit", rest)
        if off < len(rest) and rest[off] == ".":
            if ellipsis < 0 and filled != 12:
                raise _addr_error(
                    whole, "embedded IPv4 address must replace the final 2 fields of the address", rest
                )
            if filled + 4 > 16:
                raise _addr_error(
                    whole, "too many hex fields to fit an embedded IPv4 at the end of the address", rest
                )
            _parse_ipv4_fields(whole, rest)
            rest = ""
            filled += 4
            break
        filled += 2
        rest = rest[off:]
        if not rest:
            break
        if rest[0] != ":":
            raise _addr_error(whole, "unexpected character, want colon", rest)
        if len(rest) == 1:
            raise _addr_error(whole, "colon must be followed by more characters", rest)
        rest = rest[1:]
        if rest[0] == ":":
            if ellipsis >= 0:
                raise _addr_error(whole, "multiple :: in address", rest)
            ellipsis = filled
            rest = rest[1:]
            if not rest:
                break
    if rest:
        raise _addr_error(whole, "trailing garbage after address", rest)
    if filled < 16:
        if ellipsis < 0:
            raise _addr_error(whole, "address string too short")
    elif ellipsis >= 0:
        raise _addr_error(whole, "the :: must expand to at least one field of zeros", rest)
    return bool(zone)


def parse_addr(text: str) -> tuple[int, bool]:
    """netip.ParseAddr: returns (IP version, has zone); GoParseError with Go's text otherwise."""
    for ch in text:
        if ch == ".":
            _parse_ipv4_fields(text, text)
            return 4, False
        if ch == ":":
            return 6, _parse_ipv6(text)
        if ch == "%":
            raise _addr_error(text, "missing IPv6 address")
    raise _addr_error(text, "unable to parse IP")


def is_ip_address(text: str) -> bool:
    """Whether netip.ParseAddr accepts ``text`` (IPv4, IPv6, IPv6 with zone)."""
    try:
        parse_addr(text)
    except GoParseError:
        return False
    return True


def parse_prefix(text: str) -> None:
    """netip.ParsePrefix: CIDR notation; host bits may be set, zones are not allowed."""

    def fail(msg: str) -> GoParseError:
        return GoParseError(f"netip.ParsePrefix({go_quote(text)}): {msg}")

    slash = text.rfind("/")
    if slash < 0:
        raise fail("no '/'")
    try:
        version, has_zone = parse_addr(text[:slash])
    except GoParseError as err:
        raise fail(str(err)) from None
    if version == 6 and has_zone:
        raise fail("IPv6 zones cannot be present in a prefix")
    bits_text = text[slash + 1 :]
    # Atoi would take a sign and leading zeros; netip does not.
    if len(bits_text) > 1 and not "1" <= bits_text[0] <= "9":
        raise fail("bad bits after slash: " + go_quote(bits_text))
    try:
        bits = atoi(bits_text)
    except GoParseError:
        raise fail("bad bits after slash: " + go_quote(bits_text)) from None
    if not 0 <= bits <= (32 if version == 4 else 128):
        raise fail("prefix length out of range")


# --- net -----------------------------------------------------------------------------------------


def split_host_port(hostport: str) -> tuple[str, str]:
    """net.SplitHostPort: "host:port", "[v6]:port" or ":port"."""

    def fail(why: str) -> GoParseError:
        return GoParseError(f"address {hostport}: {why}" if hostport else why)

    colon = hostport.rfind(":")
    if colon < 0:
        raise fail("missing port in address")
    open_at, close_at = 0, 0
    if hostport[0] == "[":
        end = hostport.find("]")
        if end < 0:
            raise fail("missing ']' in address")
        if end + 1 == len(hostport):
            raise fail("missing port in address")
        if end + 1 != colon:
            if hostport[end + 1] == ":":
                raise fail("too many colons in address")
            raise fail("missing port in address")
        host = hostport[1:end]
        open_at, close_at = 1, end + 1
    else:
        host = hostport[:colon]
        if ":" in host:
            raise fail("too many colons in address")
    if "[" in hostport[open_at:]:
        raise fail("unexpected '[' in address")
    if "]" in hostport[close_at:]:
        raise fail("unexpected ']' in address")
    return host, hostport[colon + 1 :]
