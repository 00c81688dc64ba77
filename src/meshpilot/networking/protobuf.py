"""Small helpers for building Envoy protobuf messages."""

from __future__ import annotations

from typing import Any

from google.protobuf import any_pb2, duration_pb2, wrappers_pb2
from google.protobuf.message import Message

TYPE_PREFIX = "type.googleapis.com/"


def pack(message: Message) -> Any:
    """``message`` in an Any with the standard type URL prefix."""
    out = any_pb2.Any()
    out.Pack(message, type_url_prefix="type.googleapis.com/")
    return out


def duration(seconds: float) -> Any:
    out = duration_pb2.Duration()
    out.FromNanoseconds(round(seconds * 1_000_000_000))
    return out


def uint32(value: int) -> Any:
    return wrappers_pb2.UInt32Value(value=value)


def boolean(value: bool) -> Any:
    return wrappers_pb2.BoolValue(value=value)


def type_url(message_class: type[Message]) -> str:
    return TYPE_PREFIX + message_class.DESCRIPTOR.full_name
