"""The part of the sprig library (github.com/Masterminds/sprig/v3, ``TxtFuncMap``) that injection
templates use, with sprig's argument order (the piped value last) and its forgiving conversions."""

from __future__ import annotations

import base64
import binascii
import copy
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from meshpilot.webhooks.inject.gotemplate.builtins import FuncError
from meshpilot.webhooks.inject.gotemplate.encode import to_json, to_yaml
from meshpilot.webhooks.inject.gotemplate.gofmt import quote_go
from meshpilot.webhooks.inject.gotemplate.values import GoStruct, StrMap, plain, sprint, truth, type_name


def strval(value: Any) -> str:
    """sprig's strval: strings as they are, anything else as ``%v``."""
    return value if isinstance(value, str) else sprint(value)


def empty(value: Any) -> bool:
    """sprig's empty: nil, zero numbers, false, and empty strings, lists and maps."""
    if isinstance(value, GoStruct):
        return False
    return not truth(value)


def to_int(value: Any) -> int:
    """cast.ToInt as sprig uses it: numbers truncated, numeric strings parsed, anything else 0."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        for base in (0, 10):
            try:
                return int(text, base)
            except ValueError:
                pass
        return 0
    return 0


def to_float(value: Any) -> float:
    if isinstance(value, (bool, int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return 0.0
    return 0.0


def _strslice(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [strval(v) for v in value if v is not None]
    return [strval(value)]


def _list_of(value: Any, fn: str) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return list(value)
    if value is None:
        raise FuncError(f"cannot {fn} on type <nil>")
    raise FuncError(f"cannot {fn} on type {type_name(value)}")


def _dict_of(value: Any, fn: str) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    raise FuncError(f"{fn}: wrong type for value; expected map[string]interface {{}}; got {type_name(value)}")


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


def quote(*values: Any) -> str:
    return " ".join(quote_go(strval(v)) for v in values if v is not None)


def squote(*values: Any) -> str:
    return " ".join("'" + strval(v) + "'" for v in values if v is not None)


def indent(spaces: Any, text: Any) -> str:
    pad = " " * to_int(spaces)
    return pad + strval(text).replace("\n", "\n" + pad)


def nindent(spaces: Any, text: Any) -> str:
    return "\n" + indent(spaces, text)


def trunc(count: Any, text: Any) -> str:
    n, s = to_int(count), strval(text)
    if n < 0 and len(s) + n > 0:
        return s[len(s) + n :]
    if n >= 0 and len(s) > n:
        return s[:n]
    return s


def _go_title(text: str) -> str:
    out = []
    previous = " "
    for c in text:
        out.append(c.upper() if not (previous.isalnum() or previous == "_" or previous == "'") else c)
        previous = c
    return "".join(out)


def split(sep: Any, text: Any) -> dict[str, str]:
    return {f"_{i}": part for i, part in enumerate(_go_split(strval(text), strval(sep)))}


def _go_split(text: str, sep: str) -> list[str]:
    # strings.Split with an empty separator splits after each character.
    return list(text) if sep == "" else text.split(sep)


def _dict(*pairs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i in range(0, len(pairs), 2):
        key = strval(pairs[i])
        out[key] = pairs[i + 1] if i + 1 < len(pairs) else ""
    return out


def _set(d: Any, key: Any, value: Any) -> dict[str, Any]:
    target = _dict_of(d, "set")
    target[strval(key)] = value
    return target


def _unset(d: Any, key: Any) -> dict[str, Any]:
    target = _dict_of(d, "unset")
    target.pop(strval(key), None)
    return target


def _keys(*dicts: Any) -> list[str]:
    out: list[str] = []
    for d in dicts:
        if isinstance(d, Mapping):
            out.extend(str(k) for k in d)
    return out


def _kind_name(value: Any) -> str:
    if value is None:
        return "invalid"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float64"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "map"
    if isinstance(value, (list, tuple)):
        return "slice"
    if isinstance(value, GoStruct):
        return "ptr"
    if callable(value):
        return "func"
    return "invalid"


def _merge_into(dst: dict[str, Any], src: Mapping[str, Any], overwrite: bool) -> None:
    for key, value in src.items():
        if key in dst and isinstance(dst[key], dict) and isinstance(value, Mapping):
            _merge_into(dst[key], value, overwrite)
        elif key not in dst or (empty(dst[key]) and not overwrite) or (overwrite and not empty(value)):
            dst[key] = copy.deepcopy(value)


def merge(dst: Any, *sources: Any) -> dict[str, Any]:
    target = _dict_of(dst, "merge")
    for src in sources:
        if isinstance(src, Mapping):
            _merge_into(target, src, overwrite=False)
    return target


def merge_overwrite(dst: Any, *sources: Any) -> dict[str, Any]:
    target = _dict_of(dst, "mergeOverwrite")
    for src in sources:
        if isinstance(src, Mapping):
            _merge_into(target, src, overwrite=True)
    return target


def _go_regex(pattern: Any) -> re.Pattern[str]:
    try:
        return re.compile(strval(pattern))
    except re.error as err:
        raise FuncError(f"error parsing regexp: {err}") from None


_GO_REPL = re.compile(r"\$(?:\{(\w+)\}|(\w+))|\\")


def _go_replacement(repl: str) -> str:
    """Go's ``$1``/``${name}`` expansion, in Python's ``\\g<…>`` syntax."""

    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "\\":
            return "\\\\"
        return "\\g<" + (match.group(1) or match.group(2)) + ">"

    return _GO_REPL.sub(sub, repl)


def _regex_replace_all(pattern: Any, text: Any, repl: Any) -> str:
    regex = _go_regex(pattern)
    replacement = _go_replacement(strval(repl))
    try:
        return regex.sub(replacement, strval(text))
    except (re.error, IndexError):
        # Go expands an unknown group to nothing.
        return regex.sub(lambda m: "", strval(text))


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


def _uniq(items: Any) -> list[Any]:
    out: list[Any] = []
    for item in _list_of(items, "uniq"):
        if item not in out:
            out.append(item)
    return out


def _has(needle: Any, haystack: Any) -> bool:
    if haystack is None:
        return False
    return needle in _list_of(haystack, "has")


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


def _first(items: Any) -> Any:
    values = _list_of(items, "first") if items is not None else []
    return values[0] if values else None


def _last(items: Any) -> Any:
    values = _list_of(items, "last") if items is not None else []
    return values[-1] if values else None


def _pick(d: Any, *keys: Any) -> dict[str, Any]:
    source = d if isinstance(d, Mapping) else {}
    return {k: source[k] for k in map(strval, keys) if k in source}


def _omit(d: Any, *keys: Any) -> dict[str, Any]:
    source = d if isinstance(d, Mapping) else {}
    dropped = {strval(k) for k in keys}
    return {k: v for k, v in source.items() if k not in dropped}


def _until(count: Any) -> list[int]:
    n = to_int(count)
    return list(range(n)) if n >= 0 else list(range(0, n, -1))


FUNCS: dict[str, Callable[..., Any]] = {
    # defaults and logic
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
    # strings
    "quote": quote,
    "squote": squote,
    "indent": indent,
    "nindent": nindent,
    "trim": lambda text: strval(text).strip(" \t\n\r\v\f\u0085\u00a0"),
    "trimAll": lambda cutset, text: strval(text).strip(strval(cutset)),
    "trimPrefix": lambda prefix, text: strval(text).removeprefix(strval(prefix)),
    "trimSuffix": lambda suffix, text: strval(text).removesuffix(strval(suffix)),
    "hasPrefix": lambda prefix, text: strval(text).startswith(strval(prefix)),
    "hasSuffix": lambda suffix, text: strval(text).endswith(strval(suffix)),
    "contains": lambda substr, text: strval(substr) in strval(text),
    "split": split,
    "splitList": lambda sep, text: _go_split(strval(text), strval(sep)),
    "join": lambda sep, items: strval(sep).join(_strslice(items)),
    "replace": lambda old, new, text: strval(text).replace(strval(old), strval(new)),
    "lower": lambda text: strval(text).lower(),
    "upper": lambda text: strval(text).upper(),
    "title": lambda text: _go_title(strval(text)),
    "trunc": trunc,
    "repeat": lambda count, text: strval(text) * max(to_int(count), 0),
    "nospace": lambda text: "".join(strval(text).split()),
    "cat": lambda *values: " ".join(strval(v) for v in values if v is not None),
    "toString": strval,
    "toStrings": _strslice,
    "regexMatch": lambda pattern, text: _go_regex(pattern).search(strval(text)) is not None,
    "regexReplaceAll": _regex_replace_all,
    "regexFindAll": lambda pattern, text, n: _go_regex(pattern).findall(strval(text))[
        : None if to_int(n) < 0 else to_int(n)
    ],
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
    "until": _until,
    # lists
    "list": lambda *values: list(values),
    "first": _first,
    "last": _last,
    "rest": lambda items: _list_of(items, "rest")[1:],
    "initial": lambda items: _list_of(items, "initial")[:-1],
    "append": lambda items, value: [*_list_of(items, "append"), value],
    "push": lambda items, value: [*_list_of(items, "push"), value],
    "prepend": lambda items, value: [value, *_list_of(items, "prepend")],
    "has": _has,
    "without": lambda items, *drop: [v for v in _list_of(items, "without") if v not in drop],
    "uniq": _uniq,
    "compact": lambda items: [v for v in _list_of(items, "compact") if not empty(v)],
    "reverse": lambda items: list(reversed(_list_of(items, "reverse"))),
    "sortAlpha": lambda items: sorted(_strslice(items)),
    # dicts
    "dict": _dict,
    "get": lambda d, key: (d or {}).get(strval(key), "") if isinstance(d, Mapping) else "",
    "set": _set,
    "unset": _unset,
    "hasKey": lambda d, key: isinstance(d, Mapping) and strval(key) in d,
    "keys": _keys,
    "values": lambda d: list(d.values()) if isinstance(d, Mapping) else [],
    "pick": _pick,
    "omit": _omit,
    "merge": merge,
    "mergeOverwrite": merge_overwrite,
    "deepCopy": lambda value: copy.deepcopy(plain(value)),
    # types
    "kindIs": lambda kind, value: strval(kind) == _kind_name(value),
    "kindOf": _kind_name,
    "typeOf": type_name,
    "typeIs": lambda name, value: strval(name) == type_name(value),
}


def _product(values: list[Any]) -> int:
    out = 1
    for value in values:
        out *= to_int(value)
    return out


__all__ = ["FUNCS", "StrMap", "default", "empty", "strval", "to_int"]
