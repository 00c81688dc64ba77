"""sprig's list and dict functions. Dicts are ``map[string]interface{}``: ``set``, ``unset`` and
``merge`` change the dict they are given, as sprig's do."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from meshpilot.webhooks.inject.gotemplate.builtins import FuncError
from meshpilot.webhooks.inject.gotemplate.convert import empty, strslice, strval, to_int
from meshpilot.webhooks.inject.gotemplate.values import plain, type_name


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


COLLECTION_FUNCS: dict[str, Callable[..., Any]] = {
    # lists
    "until": _until,
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
    "sortAlpha": lambda items: sorted(strslice(items)),
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
}
