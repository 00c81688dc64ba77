"""The part of the sprig library (github.com/Masterminds/sprig/v3, ``TxtFuncMap``) that injection
templates use, with sprig's argument order (the piped value last) and its forgiving conversions:
defaults, encodings, numbers and types here, strings in ``sprig_strings``, lists and dicts in
``sprig_collections``."""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable
from typing import Any

from meshpilot.webhooks.inject.gotemplate.builtins import FuncError
from meshpilot.webhooks.inject.gotemplate.convert import empty, strval, to_float, to_int
from meshpilot.webhooks.inject.gotemplate.encode import to_json, to_yaml
from meshpilot.webhooks.inject.gotemplate.sprig_collections import COLLECTION_FUNCS
from meshpilot.webhooks.inject.gotemplate.sprig_strings import STRING_FUNCS
from meshpilot.webhooks.inject.gotemplate.values import kind_name, type_name


def _required(warn: Any, value: Any) -> Any:
    if value is None or (isinstance(value, str) and not value):
        raise FuncError(strval(warn))
    return value


def _fail(message: Any) -> str:
    raise FuncError(strval(message))


def default(default_value: Any, *given: Any) -> Any:
    if not given or empty(given[0]):
        return default_value
    return given[0]


def coalesce(*values: Any) -> Any:
    for value in values:
        if not empty(value):
            return value
    return None


def ternary(true_value: Any, false_value: Any, condition: Any) -> Any:
    return true_value if condition is True else false_value


def _b64dec(text: Any) -> str:
    try:
        return base64.b64decode(strval(text), validate=True).decode(errors="replace")
    except (binascii.Error, ValueError) as err:
        return str(err)


def _from_json(text: Any) -> Any:
    try:
        data = json.loads(strval(text))
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _to_json(value: Any) -> str:
    try:
        return to_json(value)
    except ValueError:
        return ""


def _to_pretty_json(value: Any) -> str:
    try:
        return to_json(value, indent="  ")
    except ValueError:
        return ""


def _to_yaml(value: Any) -> str:
    try:
        return to_yaml(value).removesuffix("\n")
    except ValueError:
        return ""


def _numbers(fn: Callable[[int, int], int], name: str) -> Callable[..., int]:
    def apply(a: Any, b: Any) -> int:
        x, y = to_int(a), to_int(b)
        if name in ("div", "mod") and y == 0:
            raise FuncError("integer divide by zero")
        return fn(x, y)

    return apply


def _go_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _go_mod(a: int, b: int) -> int:
    return a - b * _go_div(a, b)


def _product(values: list[Any]) -> int:
    out = 1
    for value in values:
        out *= to_int(value)
    return out


FUNCS: dict[str, Callable[..., Any]] = {
    # defaults
    "default": default,
    "empty": empty,
    "coalesce": coalesce,
    "ternary": ternary,
    "required": _required,
    "fail": _fail,
    # encodings
    "toJson": _to_json,
    "toPrettyJson": _to_pretty_json,
    "toRawJson": _to_json,
    "fromJson": _from_json,
    "toYaml": _to_yaml,
    "b64enc": lambda text: base64.b64encode(strval(text).encode()).decode(),
    "b64dec": _b64dec,
    # numbers
    "int": to_int,
    "int64": to_int,
    "float64": to_float,
    "atoi": lambda text: int(strval(text)) if re.fullmatch(r"[+-]?\d+", strval(text)) else 0,
    "add": lambda *values: sum(to_int(v) for v in values),
    "add1": lambda value: to_int(value) + 1,
    "sub": _numbers(lambda a, b: a - b, "sub"),
    "mul": lambda first, *rest: _product([first, *rest]),
    "div": _numbers(_go_div, "div"),
    "mod": _numbers(_go_mod, "mod"),
    "max": lambda first, *rest: max(to_int(v) for v in (first, *rest)),
    "min": lambda first, *rest: min(to_int(v) for v in (first, *rest)),
    # types
    "kindIs": lambda kind, value: strval(kind) == kind_name(value),
    "kindOf": kind_name,
    "typeOf": type_name,
    "typeIs": lambda name, value: strval(name) == type_name(value),
    **STRING_FUNCS,
    **COLLECTION_FUNCS,
}
