"""How Python values stand in for Go's: what is missing, what is a struct, what is true, how to print.

* ``MISSING`` is Go's invalid ``reflect.Value`` (a map key that is not there); it prints
  ``<no value>``. ``None`` is nil. A pipeline that yields nil yields ``MISSING``, as in Go.
* ``dict`` is ``map[string]interface{}``: a missing key is ``MISSING``. ``StrMap`` is
  ``map[string]string``: a missing key is ``""`` (Go's zero value), which is what pod labels and
  annotations are.
* ``GoStruct`` is anything with Go-named fields and methods (a Kubernetes object, a proto message).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable


class _Missing:
    _instance: _Missing | None = None

    def __new__(cls) -> _Missing:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Any = _Missing()


class StrMap(dict[str, str]):
    """A Go ``map[string]string``: indexing a missing key gives ``""``."""


@runtime_checkable
class GoStruct(Protocol):
    """A Go struct (or pointer to one) seen by templates."""

    def go_field(self, name: str) -> Any:
        """The field's value; raises KeyError when the type has no such field."""

    def go_method(self, name: str) -> Callable[..., Any] | None:
        """The bound method of that name, or None."""

    def go_type(self) -> str:
        """The Go type's name, for error messages."""

    def to_plain(self) -> Any:
        """What Go's encoding/json would write for it, as plain Python data."""


def plain(value: Any) -> Any:
    """Structs replaced by their JSON shape, recursively (for toJson, toYaml and the like)."""
    if isinstance(value, GoStruct):
        return plain(value.to_plain())
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if value is MISSING:
        return None
    return value


def truth(value: Any) -> bool:
    """Go's template truth: false, 0, nil, and empty strings, slices and maps are false."""
    if value is MISSING or value is None:
        return False
    if isinstance(value, GoStruct):
        return bool(value)  # a nil pointer to a struct defines __bool__ as False
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value != 0
    if isinstance(value, (str, bytes, list, tuple, dict)):
        return len(value) > 0
    return True


#: Python types and Go's names for them: the type (``%T``) and the reflect kind (sprig's ``kindOf``).
#: Order matters: bool before int, StrMap before dict.
_GO_TYPES: tuple[tuple[type | tuple[type, ...], str, str], ...] = (
    (bool, "bool", "bool"),
    (int, "int", "int"),
    (float, "float64", "float64"),
    (str, "string", "string"),
    (StrMap, "map[string]string", "map"),
    (dict, "map[string]interface {}", "map"),
    ((list, tuple), "[]interface {}", "slice"),
)


def type_name(value: Any) -> str:
    """Go's name for the value's type, as ``%T`` and error messages print it."""
    if value is MISSING or value is None:
        return "<nil>"
    if isinstance(value, GoStruct):
        return value.go_type()
    for python_type, go_type, _ in _GO_TYPES:
        if isinstance(value, python_type):
            return go_type
    if callable(value):
        return "func"
    return type(value).__name__


def kind_name(value: Any) -> str:
    """Go's reflect kind of the value (``invalid`` for nil)."""
    if value is None or value is MISSING:
        return "invalid"
    for python_type, _, kind in _GO_TYPES:
        if isinstance(value, python_type):
            return kind
    if isinstance(value, Mapping):
        return "map"
    if isinstance(value, GoStruct):
        return "ptr"
    if callable(value):
        return "func"
    return "invalid"


def format_float(value: float, verb: str = "g", precision: int = -1) -> str:
    """Go's strconv.FormatFloat for 'g' (shortest when precision is -1), 'e' and 'f'."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if verb == "f":
        return f"{value:.{6 if precision < 0 else precision}f}"
    if verb == "e":
        text = f"{value:.{6 if precision < 0 else precision}e}"
        return _go_exponent(text)
    # 'g': the shortest digits that round-trip; %e when the exponent is < -4 or >= 6 (Go's %v).
    if precision < 0:
        if value == 0:
            return "-0" if math.copysign(1.0, value) < 0 else "0"
        digits = repr(value)
        mantissa, _, exp_text = digits.partition("e")
        sign = "-" if mantissa.startswith("-") else ""
        mantissa = mantissa.lstrip("-")
        int_part, _, frac = mantissa.partition(".")
        if frac == "0":
            frac = ""
        all_digits = (int_part + frac).lstrip("0") or "0"
        exp = int(exp_text or 0) + len(int_part) - 1
        if int_part == "0":
            exp = int(exp_text or 0) - (len(frac) - len(frac.lstrip("0"))) - 1
        all_digits = all_digits.rstrip("0") or "0"
        if exp < -4 or exp >= 6:
            body = all_digits[0] + ("." + all_digits[1:] if len(all_digits) > 1 else "")
            return f"{sign}{body}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
        if exp < 0:
            return f"{sign}0.{'0' * (-exp - 1)}{all_digits}"
        if len(all_digits) <= exp + 1:
            return sign + all_digits + "0" * (exp + 1 - len(all_digits))
        return f"{sign}{all_digits[: exp + 1]}.{all_digits[exp + 1 :]}"
    return _go_exponent(f"{value:.{precision}g}")


def _go_exponent(text: str) -> str:
    # Python writes e+06, Go e+06 too, but Python may write e+100 the same; only normalise 'e-5'.
    mantissa, sep, exp = text.partition("e")
    if not sep:
        return text
    sign = exp[0] if exp[0] in "+-" else "+"
    digits = exp.lstrip("+-")
    return f"{mantissa}e{sign}{int(digits):02d}"


def sprint(value: Any) -> str:
    """``fmt.Sprint`` of one value (Go's ``%v``)."""
    if value is MISSING:
        return "<no value>"
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return format_float(value)
    if isinstance(value, str):
        return value
    if isinstance(value, GoStruct):
        method = value.go_method("String")
        if method is not None:
            return str(method())
        return _sprint_nested(value.to_plain(), struct=True)
    if isinstance(value, Mapping):
        return "map[" + " ".join(f"{k}:{_sprint_inner(v)}" for k, v in sorted(value.items())) + "]"
    if isinstance(value, (list, tuple)):
        return "[" + " ".join(_sprint_inner(v) for v in value) + "]"
    return str(value)


def _sprint_inner(value: Any) -> str:
    if value is MISSING:
        return "<nil>"
    return sprint(value)


def _sprint_nested(value: Any, struct: bool) -> str:
    if struct and isinstance(value, Mapping):
        return "{" + " ".join(_sprint_inner(v) for v in value.values()) + "}"
    return sprint(value)
