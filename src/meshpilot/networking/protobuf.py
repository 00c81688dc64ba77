"""Small helpers for building Envoy protobuf messages."""

from __future__ import annotations

from typing import Any

from google.protobuf import any_pb2, duration_pb2, wrappers_pb2
from google.protobuf.message import Message

TYPE_PREFIX = "type.googleapis.com/"


def serialize(message: Message) -> bytes:
    """The wire bytes of ``message``, the same in every process.

    Without ``deterministic``, map fields (a Struct's fields, ``filter_metadata``,
    ``typed_extension_protocol_options``) are written in hash-table order, which differs between
    processes: two replicas, or a server and its restart, would give one config different bytes and
    so different versions, and a proxy that reconnects would be sent everything again.
    """
    data: bytes = message.SerializeToString(deterministic=True)
    return data


def pack(message: Message) -> Any:
    """``message`` in an Any with the standard type URL prefix (bytes as ``serialize`` writes them)."""
    out = any_pb2.Any()
    out.Pack(message, type_url_prefix="type.googleapis.com/", deterministic=True)
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
