"""Kubernetes resource quantities in canonical form. istiod's template copies the resource annotations
as they are, but the pod goes through Go's ``resource.Quantity``, so ``4000m`` comes out as ``4`` and
``1024Mi`` as ``1Gi``; the pod meshpilot writes should read the same."""

from __future__ import annotations

import re
from fractions import Fraction

from meshpilot.input_limits import InputRejected, check_number_text
from meshpilot.webhooks.inject.config import InjectionError

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_MAX_EXPONENT = 30
_QUANTITY = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)


def canonical_quantity(text: str, what: str) -> str:
    try:
        check_number_text(text.strip(), what)
    except InputRejected as err:
        raise InjectionError(str(err)) from None
    match = _QUANTITY.match(text.strip())
    if not match:
        raise InjectionError(f"{what}: {text!r} is not a resource quantity")
    number, suffix = Fraction(match.group(1)), match.group(2) or ""
    binary = suffix in _BINARY
    exponent_form = suffix[:1] in ("e", "E")
    if binary:
        value = number * 1024 ** _BINARY[suffix]
    elif exponent_form:
        # Go's Quantity keeps the exponent in an int32 scale; past Exa no resource has meaning, and
        # 10**(10**9) would take minutes to compute.
        if abs(int(suffix[1:])) > _MAX_EXPONENT:
            raise InjectionError(f"{what}: {text!r} is out of range")
        value = number * Fraction(10) ** int(suffix[1:])
    else:
        value = number * Fraction(10) ** _DECIMAL[suffix]
    sign = "-" if value < 0 else ""
    value = abs(value)
    # Go keeps nano precision at most, rounding up.
    nanos = value * 10**9
    if nanos.denominator != 1:
        value = Fraction(int(nanos) + 1, 10**9)
    # Binary suffixes stay binary only for whole values of at least 1Ki.
    if binary and value.denominator == 1 and value >= 1024:
        whole = int(value)
        power = 0
        while power < 6 and whole % 1024 == 0:
            whole //= 1024
            power += 1
        names = {v: k for k, v in _BINARY.items()}
        return f"{sign}{whole}{names.get(power, '')}"
    if value == 0:
        return "0"
    for exponent in (18, 15, 12, 9, 6, 3, 0, -3, -6, -9):
        scaled = value / Fraction(10) ** exponent
        if scaled.denominator == 1:
            if exponent_form:  # Go keeps the exponent notation the quantity was written in
                return f"{sign}{int(scaled)}" + (f"e{exponent}" if exponent else "")
            names = {v: k for k, v in _DECIMAL.items()}
            return f"{sign}{int(scaled)}{names[exponent]}"
    raise AssertionError("unreachable: values are rounded to nano precision")
