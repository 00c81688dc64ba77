"""Istio specs from JSON-like dicts into protobuf messages, as istiod reads them.

istiod decodes specs with Go's jsonpb, which differs from protobuf's canonical
JSON mapping in one way users rely on: durations are Go durations ("5m",
"1h30m", "250ms"), not only "300s". Durations are rewritten to the canonical
form before protobuf's own parser, which then rejects unknown fields and wrong
types just as istiod does.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from meshpilot.config.errors import ConfigError, type_name

_DURATION = "google.protobuf.Duration"
_UNITS = {
    "ns": Decimal(1),
    "us": Decimal(1000),
    "µs": Decimal(1000),  # U+00B5 micro sign
    "μs": Decimal(1000),  # U+03BC Greek mu
    "ms": Decimal(1000_000),
    "s": Decimal(1000_000_000),
    "m": Decimal(60 * 1000_000_000),
    "h": Decimal(3600 * 1000_000_000),
}
_PART = re.compile(r"(\d*\.?\d*)(ns|us|µs|μs|ms|s|m|h)")
# Envoy and protobuf limit durations to about 10,000 years.
_MAX_SECONDS = 315_576_000_000


def parse_go_duration(text: str) -> Decimal:
    """Seconds in a Go duration string such as "1h30m" or "-1.5s"; ValueError if invalid."""
    s = text.strip()
    sign = Decimal(1)
    if s[:1] in "+-" and s:
        sign = Decimal(-1) if s[0] == "-" else Decimal(1)
        s = s[1:]
    if s == "0":
        return Decimal(0)
    if not s:
        raise ValueError(f"invalid duration {text!r}")
    total = Decimal(0)
    pos = 0
    while pos < len(s):
        match = _PART.match(s, pos)
        if match is None or match.group(1) in ("", "."):
            raise ValueError(f"invalid duration {text!r}")
        total += Decimal(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    return sign * total / Decimal(1000_000_000)


def _canonical_duration(value: Any, path: str) -> Any:
    if not isinstance(value, str):
        raise ConfigError(f'must be a duration such as "5s", got {type_name(value)}', path)
    try:
        seconds = parse_go_duration(value)
    except ValueError:
        raise ConfigError(f"invalid duration {value!r}", path) from None
    if abs(seconds) > _MAX_SECONDS:
        raise ConfigError(f"duration {value!r} is out of range", path)
    text = format(seconds.quantize(Decimal("0.000000001")).normalize(), "f")
    return f"{text}s"


_INT_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT32,
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT32,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT32,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED32,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED32,
        FieldDescriptor.TYPE_SFIXED64,
    }
)
_FLOAT_TYPES = frozenset({FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT})
# Wrapper and other well-known messages have JSON forms protobuf checks itself.
_WELL_KNOWN = "google.protobuf."


def _rewrite(data: Any, descriptor: Any, path: str) -> dict[str, Any]:
    """Check ``data`` against ``descriptor``; return a copy with canonical durations.

    Errors name the field path and say what was expected, which protobuf's own
    parser (run afterwards) does only vaguely.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"must be an object, got {type_name(data)}", path)
    out: dict[str, Any] = {}
    for key, value in data.items():
        where = f"{path}.{key}"
        field = descriptor.fields_by_camelcase_name.get(key) or descriptor.fields_by_name.get(key)
        if field is None:
            raise ConfigError(f"unknown field {key!r} in {descriptor.name}", where)
        if value is None:
            continue  # null means unset, as in jsonpb
        message_type = field.message_type
        if message_type is not None and message_type.GetOptions().map_entry:
            if not isinstance(value, dict):
                raise ConfigError(f"must be a map, got {type_name(value)}", where)
            value_field = message_type.fields_by_name["value"]
            key_field = message_type.fields_by_name["key"]
            converted = {}
            for k, v in value.items():
                if key_field.type == FieldDescriptor.TYPE_STRING and not isinstance(k, str):
                    raise ConfigError(f"map key {k!r} must be a string", where)
                converted[k] = _value(v, value_field, f"{where}.{k}")
            out[key] = converted
        elif field.is_repeated:
            if not isinstance(value, list):
                raise ConfigError(f"must be a list, got {type_name(value)}", where)
            out[key] = [_value(v, field, f"{where}[{i}]") for i, v in enumerate(value)]
        else:
            out[key] = _value(value, field, where)
    return out


def _value(value: Any, field: FieldDescriptor, path: str) -> Any:
    message_type = field.message_type
    if message_type is not None:
        if message_type.full_name == _DURATION:
            return _canonical_duration(value, path)
        if message_type.full_name.startswith(_WELL_KNOWN):
            return value
        return _rewrite(value, message_type, path)
    kind = field.type
    if kind == FieldDescriptor.TYPE_STRING:
        if not isinstance(value, str):
            raise ConfigError(f"must be a string, got {type_name(value)}", path)
    elif kind == FieldDescriptor.TYPE_BOOL:
        if not isinstance(value, bool):
            raise ConfigError(f"must be a boolean, got {type_name(value)}", path)
    elif kind in _INT_TYPES:
        # jsonpb also takes integers written as strings.
        ok = (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, str) and value.lstrip("-").isdigit()
        )
        if not ok:
            raise ConfigError(f"must be an integer, got {type_name(value)}", path)
    elif kind in _FLOAT_TYPES:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ConfigError(f"must be a number, got {type_name(value)}", path)
    elif kind == FieldDescriptor.TYPE_ENUM:
        assert field.enum_type is not None
        names = field.enum_type.values_by_name
        if isinstance(value, str):
            if value not in names:
                allowed = ", ".join(names)
                raise ConfigError(f"unknown value {value!r} (allowed: {allowed})", path)
        elif isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"must be one of {', '.join(names)}, got {type_name(value)}", path)
    return value


def parse_spec(data: Any, message: Message, path: str = "spec") -> None:
    """Fill ``message`` from ``data``; ConfigError naming the field on failure."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("must be an object", path)
    rewritten = _rewrite(data, message.DESCRIPTOR, path)
    try:
        json_format.ParseDict(rewritten, message, ignore_unknown_fields=False)
    except json_format.ParseError as err:
        raise ConfigError(_tidy(str(err)), path) from None


def _tidy(message: str) -> str:
    # protobuf says "Message type "istio.x.Y" has no field named "foo" at "Y.a.b"."
    return message.replace('Message type "', 'message "').rstrip(".")
