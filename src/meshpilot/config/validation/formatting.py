"""Go's value formatting, as it shows up inside istiod's validation messages.

Users and tools match on istiod's message texts, so the pieces that Go's fmt
package renders (quoted strings, floats, durations, slices, enum names) are
rendered here the way Go renders them rather than the way Python would.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

_SIMPLE_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    '"': '\\"',
    "\\": "\\\\",
}


def go_quote(text: str) -> str:
    """``%q`` of a string: Go's strconv.Quote."""
    out = ['"']
    for ch in text:
        escaped = _SIMPLE_ESCAPES.get(ch)
        if escaped is not None:
            out.append(escaped)
        elif ch.isprintable():
            # Python's and Go's notions of "printable" agree: letters, marks,
            # numbers, punctuation, symbols and the ASCII space.
            out.append(ch)
        else:
            code = ord(ch)
            if code < 0x80:
                out.append(f"\\x{code:02x}")
            elif code <= 0xFFFF:
                out.append(f"\\u{code:04x}")
            else:
                out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def go_float(value: float) -> str:
    """``%v`` of a float64: the shortest representation, as Go's 'g' format with exponent limits."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    sign, digits, exponent = Decimal(repr(value)).normalize().as_tuple()
    assert isinstance(exponent, int)
    text = "".join(str(d) for d in digits)
    # The decimal exponent of the leading digit.
    lead = len(text) + exponent - 1
    prefix = "-" if sign else ""
    if lead < -4 or lead >= 21:
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        return f"{prefix}{mantissa}e{'-' if lead < 0 else '+'}{abs(lead):02d}"
    if exponent >= 0:
        return prefix + text + "0" * exponent
    point = len(text) + exponent
    if point > 0:
        return f"{prefix}{text[:point]}.{text[point:]}"
    return f"{prefix}0.{'0' * -point}{text}"


def go_fixed(value: float) -> str:
    """``%f`` of a float64."""
    return f"{value:.6f}"


def go_list(items: Iterable[Any]) -> str:
    """``%v`` of a slice: ``[a b c]``."""
    return "[" + " ".join(str(item) for item in items) + "]"


def _fraction(value: int, precision: int) -> tuple[str, int]:
    """Go's fmtFrac: the fractional digits without trailing zeros, and the integer part."""
    whole, frac = divmod(value, 10**precision)
    digits = str(frac).rjust(precision, "0").rstrip("0") if precision else ""
    return ("." + digits if digits else ""), whole


def go_duration(nanos: int) -> str:
    """time.Duration.String(): ``1h0m0s``, ``1.5s``, ``250ms``, ``0s``."""
    if nanos == 0:
        return "0s"
    sign = "-" if nanos < 0 else ""
    u = abs(nanos)
    if u < 1_000_000_000:
        if u < 1_000:
            unit, precision = "ns", 0
        elif u < 1_000_000:
            unit, precision = "µs", 3
        else:
            unit, precision = "ms", 6
        frac, whole = _fraction(u, precision)
        return f"{sign}{whole}{frac}{unit}"
    frac, seconds = _fraction(u, 9)
    text = f"{seconds % 60}{frac}s"
    minutes = seconds // 60
    if minutes:
        text = f"{minutes % 60}m{text}"
        hours = minutes // 60
        if hours:
            text = f"{hours}h{text}"
    return sign + text


def enum_name(message: Any, field: str) -> str:
    """``%v``/``%s`` of a proto enum field: its value's name, or the number when it has none."""
    descriptor = message.DESCRIPTOR.fields_by_name[field].enum_type
    number = getattr(message, field)
    value = descriptor.values_by_number.get(number)
    return value.name if value is not None else str(number)


def proto_text(message: Any) -> str:
    """``%v`` of a (flat) proto message: ``number:80 protocol:"HTTP"``.

    Go deliberately randomizes the whitespace of this form, so no caller can
    rely on more than its start.
    """
    parts = []
    for field, value in message.ListFields():
        text = go_quote(value) if isinstance(value, str) else str(value)
        parts.append(f"{field.name}:{text}")
    return " ".join(parts)
