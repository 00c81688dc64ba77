"""JSON and YAML as Go writes them: encoding/json (map keys sorted, struct fields in order, ``<``,
``>``, ``&`` escaped, integral floats without ``.0``) and sigs.k8s.io/yaml (JSON, then YAML with
sorted keys)."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping
from typing import Any

import yaml

from meshpilot.webhooks.inject.gotemplate.values import MISSING, GoStruct


class StructDict(dict[str, Any]):
    """A struct's JSON object: its fields keep their order (a plain map's keys are sorted)."""


def _go_shape(value: Any) -> Any:
    if isinstance(value, GoStruct):
        inner = value.to_plain()
        if isinstance(inner, Mapping):
            return StructDict((str(k), _go_shape(v)) for k, v in inner.items())
        return _go_shape(inner)
    if isinstance(value, StructDict):
        return StructDict((k, _go_shape(v)) for k, v in value.items())
    if isinstance(value, Mapping):
        return {str(k): _go_shape(value[k]) for k in sorted(value, key=str)}
    if isinstance(value, (list, tuple)):
        return [_go_shape(v) for v in value]
    if value is MISSING:
        return None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < 1e21:
        return int(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"json: unsupported value: {value}")
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ValueError(f"json: unsupported type: {type(value).__name__}")


def _escape_html(text: str) -> str:
    return (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def to_json(value: Any, indent: str = "") -> str:
    """``json.Marshal`` (or ``MarshalIndent`` with ``indent``)."""
    shaped = _go_shape(value)
    if indent:
        text = json.dumps(shaped, ensure_ascii=False, indent=len(indent))
    else:
        text = json.dumps(shaped, ensure_ascii=False, separators=(",", ":"))
    return _escape_html(text)


def proto_json(data: Any) -> str:
    """protomarshal.ToJSON of a message held as plain data (set fields only, in proto order):
    compact, UTF-8 unescaped, no HTML escaping."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def plain_data(value: Any) -> Any:
    """The value as JSON-decoded data: what Go's YAML writer sees after its JSON round trip."""
    return json.loads(to_json(value))


class _Dumper(yaml.SafeDumper):
    pass


def _str_representer(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    style = "|" if "\n" in data and all(c.isprintable() or c == "\n" for c in data) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str_representer)


def to_yaml(value: Any) -> str:
    """sigs.k8s.io/yaml's Marshal: keys sorted, block style, a trailing newline."""
    data = plain_data(value)
    text = yaml.dump(
        data, Dumper=_Dumper, sort_keys=True, default_flow_style=False, width=1 << 30, allow_unicode=True
    )
    if text.endswith("\n...\n"):
        text = text[: -len("...\n")]
    return text
