"""Go text/template's predefined functions (``text/template/funcs.go``).

``and`` and ``or`` are here for parsing and for ``call``-free lookups; the executor evaluates them
itself so they short-circuit. Functions in ``RAW_ARGS`` see a missing value as ``MISSING`` (Go
hands them ``reflect.Value``s); all others see ``None``."""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from meshpilot.webhooks.inject.gotemplate.gofmt import sprint_args, sprintf, sprintln_args
from meshpilot.webhooks.inject.gotemplate.values import MISSING, GoStruct, StrMap, truth, type_name


class FuncError(Exception):
    """A function's own error (Go's second return value)."""


def _and(*args: Any) -> Any:
    for arg in args:
        if not truth(arg):
            return arg
    return args[-1]


def _or(*args: Any) -> Any:
    for arg in args:
        if truth(arg):
            return arg
    return args[-1]


def _not(arg: Any) -> bool:
    return not truth(arg)


def _len(item: Any) -> int:
    if isinstance(item, str):
        return len(item.encode())
    if isinstance(item, (list, tuple, Mapping)):
        return len(item)
    if item is MISSING or item is None:
        raise FuncError("len of nil pointer")
    raise FuncError(f"len of type {type_name(item)}")


def _index_one(item: Any, key: Any) -> Any:
    if isinstance(item, Mapping):
        if not isinstance(key, str) and not (isinstance(key, int) and any(isinstance(k, int) for k in item)):
            raise FuncError(f"value has type {type_name(key)}; should be string")
        if key in item:
            return item[key]
        return "" if isinstance(item, StrMap) else MISSING
    if isinstance(item, (list, tuple, str)):
        if isinstance(key, bool) or not isinstance(key, int):
            raise FuncError(f"cannot index slice/array with type {type_name(key)}")
        data = item.encode() if isinstance(item, str) else item
        if not 0 <= key < len(data):
            raise FuncError(f"index out of range: {key}")
        return data[key]
    if item is MISSING or item is None:
        raise FuncError("index of untyped nil")
    raise FuncError(f"can't index item of type {type_name(item)}")


def _index(item: Any, *keys: Any) -> Any:
    for key in keys:
        item = _index_one(item, None if key is MISSING else key)
        if item is MISSING:
            return MISSING
    return item


def _slice(item: Any, *indexes: Any) -> Any:
    if item is MISSING or item is None:
        raise FuncError("slice of untyped nil")
    if len(indexes) > 3:
        raise FuncError(f"too many slice indexes: {len(indexes)}")
    if not isinstance(item, (str, list, tuple)):
        raise FuncError(f"can't slice item of type {type_name(item)}")
    if isinstance(item, str) and len(indexes) == 3:
        raise FuncError("cannot 3-index slice a string")
    size = len(item.encode()) if isinstance(item, str) else len(item)
    bounds = [0, size]
    for i, index in enumerate(indexes[:2]):
        if isinstance(index, bool) or not isinstance(index, int):
            raise FuncError(f"cannot index slice/array with type {type_name(index)}")
        bounds[i] = index
    if not 0 <= bounds[0] <= bounds[1] <= size:
        raise FuncError(f"invalid slice index: {bounds[0]} > {bounds[1]}")
    if isinstance(item, str):
        return item.encode()[bounds[0] : bounds[1]].decode(errors="replace")
    return list(item[bounds[0] : bounds[1]])


def _kind(value: Any) -> str:
    if value is MISSING or value is None:
        return "invalid"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "other"


def _eq(arg1: Any, *others: Any) -> bool:
    if not others:
        raise FuncError("missing argument for comparison")
    k1 = _kind(arg1)
    for arg in others:
        k2 = _kind(arg)
        if k1 != k2:
            if k1 != "invalid" and k2 != "invalid":
                raise FuncError("incompatible types for comparison")
            continue
        if k1 == "invalid":
            return True
        if k1 == "other" and (isinstance(arg1, (list, Mapping)) or isinstance(arg, (list, Mapping))):
            raise FuncError(f"non-comparable type {sprint_args([arg1])}: {type_name(arg1)}")
        if arg1 == arg:
            return True
    return False


def _ne(arg1: Any, arg2: Any) -> bool:
    return not _eq(arg1, arg2)


def _ordered(arg1: Any, arg2: Any) -> tuple[Any, Any]:
    k1, k2 = _kind(arg1), _kind(arg2)
    if k1 not in ("number", "string") or k2 not in ("number", "string"):
        raise FuncError("invalid type for comparison")
    if k1 != k2:
        raise FuncError("incompatible types for comparison")
    return arg1, arg2


def _lt(arg1: Any, arg2: Any) -> bool:
    a, b = _ordered(arg1, arg2)
    return bool(a < b)


def _le(arg1: Any, arg2: Any) -> bool:
    a, b = _ordered(arg1, arg2)
    return bool(a <= b)


def _gt(arg1: Any, arg2: Any) -> bool:
    a, b = _ordered(arg1, arg2)
    return bool(a > b)


def _ge(arg1: Any, arg2: Any) -> bool:
    a, b = _ordered(arg1, arg2)
    return bool(a >= b)


def _text_of(args: tuple[Any, ...]) -> str:
    if len(args) == 1 and isinstance(args[0], str):
        return args[0]
    return sprint_args([None if a is MISSING else a for a in args])


_HTML = {"<": "&lt;", ">": "&gt;", "&": "&amp;", "'": "&#39;", '"': "&#34;", "\0": "\ufffd"}


def _html(*args: Any) -> str:
    return "".join(_HTML.get(c, c) for c in _text_of(args))


_JS = {"\\": "\\\\", "'": "\\'", '"': '\\"', "<": "\\u003C", ">": "\\u003E", "&": "\\u0026", "=": "\\u003D"}


def _js(*args: Any) -> str:
    out = []
    for c in _text_of(args):
        if c in _JS:
            out.append(_JS[c])
        elif ord(c) < 0x20 or (ord(c) >= 0x80 and not c.isprintable()):
            out.append(f"\\u{ord(c):04X}")
        else:
            out.append(c)
    return "".join(out)


def _urlquery(*args: Any) -> str:
    return urllib.parse.quote_plus(_text_of(args), safe="-_.~")


def _call(fn: Any, *args: Any) -> Any:
    if isinstance(fn, GoStruct) or not callable(fn):
        raise FuncError(f"non-function of type {type_name(fn)}")
    return fn(*[None if a is MISSING else a for a in args])


def _printf(fmt: Any, *args: Any) -> str:
    if not isinstance(fmt, str):
        raise FuncError(f"wrong type for value; expected string; got {type_name(fmt)}")
    return sprintf(fmt, list(args))


BUILTINS: dict[str, Callable[..., Any]] = {
    "and": _and,
    "or": _or,
    "not": _not,
    "len": _len,
    "index": _index,
    "slice": _slice,
    "eq": _eq,
    "ne": _ne,
    "lt": _lt,
    "le": _le,
    "gt": _gt,
    "ge": _ge,
    "html": _html,
    "js": _js,
    "urlquery": _urlquery,
    "call": _call,
    "print": lambda *args: sprint_args(list(args)),
    "printf": _printf,
    "println": lambda *args: sprintln_args(list(args)),
}

RAW_ARGS = frozenset({"and", "or", "not", "len", "index", "slice", "eq", "ne", "lt", "le", "gt", "ge"})
