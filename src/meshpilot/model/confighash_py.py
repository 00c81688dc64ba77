"""Stable 64-bit hashes of configs and proxy state (pure-Python twin).

``hash_bytes`` is XXH64. ``hash_value`` is XXH64 of a canonical encoding of a
plain value, so two equal values hash equally in every process and run (unlike
``hash()``, which is salted per process). Dicts and sets hash the same whatever
their iteration order. ``ext/confighash.pyx`` is the compiled twin; both must
return identical results for every input.

Canonical encoding, one tag byte then the payload (lengths and counts are
unsigned 32-bit little-endian):

=========  =====  ===============================================
value      tag    payload
=========  =====  ===============================================
None       ``n``  none
True       ``t``  none
False      ``f``  none
int        ``i``  signed 64-bit little-endian, if it fits
int        ``I``  length, then the decimal digits, otherwise
float      ``d``  IEEE-754 double, little-endian
str        ``s``  length, then UTF-8 bytes
bytes      ``b``  length, then the bytes
list/tuple ``l``  count, then each item
dict       ``m``  count, then key and value of each entry, sorted by encoded key
set        ``S``  count, then each item, sorted by encoding
message    ``p``  full name as a str, then deterministic serialization as bytes
=========  =====  ===============================================
"""

from __future__ import annotations

import struct
from typing import Any

from google.protobuf.message import Message

_MASK = 0xFFFFFFFFFFFFFFFF
_P1 = 11400714785074694791
_P2 = 14029467366897019727
_P3 = 1609587929392839161
_P4 = 9650029242287828579
_P5 = 2870177450012600261

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _MASK


def _round(acc: int, lane: int) -> int:
    acc = (acc + lane * _P2) & _MASK
    return (_rotl(acc, 31) * _P1) & _MASK


def _merge_round(acc: int, val: int) -> int:
    acc ^= _round(0, val)
    return (acc * _P1 + _P4) & _MASK


def hash_bytes(data: bytes, seed: int = 0) -> int:
    """XXH64 of ``data``; ``seed`` is taken modulo 2**64."""
    seed &= _MASK
    n = len(data)
    pos = 0
    if n >= 32:
        v1 = (seed + _P1 + _P2) & _MASK
        v2 = (seed + _P2) & _MASK
        v3 = seed
        v4 = (seed - _P1) & _MASK
        limit = n - 32
        while pos <= limit:
            a, b, c, d = struct.unpack_from("<4Q", data, pos)
            v1 = _round(v1, a)
            v2 = _round(v2, b)
            v3 = _round(v3, c)
            v4 = _round(v4, d)
            pos += 32
        h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & _MASK
        h = _merge_round(h, v1)
        h = _merge_round(h, v2)
        h = _merge_round(h, v3)
        h = _merge_round(h, v4)
    else:
        h = (seed + _P5) & _MASK
    h = (h + n) & _MASK
    while pos + 8 <= n:
        (lane,) = struct.unpack_from("<Q", data, pos)
        h ^= _round(0, lane)
        h = (_rotl(h, 27) * _P1 + _P4) & _MASK
        pos += 8
    if pos + 4 <= n:
        (word,) = struct.unpack_from("<I", data, pos)
        h ^= (word * _P1) & _MASK
        h = (_rotl(h, 23) * _P2 + _P3) & _MASK
        pos += 4
    while pos < n:
        h ^= (data[pos] * _P5) & _MASK
        h = (_rotl(h, 11) * _P1) & _MASK
        pos += 1
    h ^= h >> 33
    h = (h * _P2) & _MASK
    h ^= h >> 29
    h = (h * _P3) & _MASK
    h ^= h >> 32
    return h


def _encode(value: Any, out: bytearray) -> None:
    # bool before int: bool is a subclass of int.
    if value is None:
        out += b"n"
    elif value is True:
        out += b"t"
    elif value is False:
        out += b"f"
    elif isinstance(value, int):
        if _INT64_MIN <= value <= _INT64_MAX:
            out += b"i"
            out += struct.pack("<q", value)
        else:
            digits = str(value).encode()
            out += b"I"
            out += struct.pack("<I", len(digits))
            out += digits
    elif isinstance(value, str):
        raw = value.encode("utf-8", "surrogatepass")
        out += b"s"
        out += struct.pack("<I", len(raw))
        out += raw
    elif isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        out += b"b"
        out += struct.pack("<I", len(raw))
        out += raw
    elif isinstance(value, float):
        out += b"d"
        out += struct.pack("<d", value)
    elif isinstance(value, (list, tuple)):
        out += b"l"
        out += struct.pack("<I", len(value))
        for item in value:
            _encode(item, out)
    elif isinstance(value, dict):
        entries = sorted(((_encoded(k), v) for k, v in value.items()), key=_first)
        out += b"m"
        out += struct.pack("<I", len(entries))
        for key, item in entries:
            out += key
            _encode(item, out)
    elif isinstance(value, (set, frozenset)):
        items = sorted(_encoded(item) for item in value)
        out += b"S"
        out += struct.pack("<I", len(items))
        for encoded in items:
            out += encoded
    elif isinstance(value, Message):
        out += b"p"
        _encode(value.DESCRIPTOR.full_name, out)
        _encode(value.SerializeToString(deterministic=True), out)
    else:
        raise TypeError(f"cannot hash a value of type {type(value).__name__}")


def _first(entry: tuple[bytes, Any]) -> bytes:
    return entry[0]


def _encoded(value: Any) -> bytes:
    out = bytearray()
    _encode(value, out)
    return bytes(out)


def encode_value(value: Any) -> bytes:
    """The canonical encoding of ``value`` (see the module docstring)."""
    return _encoded(value)


def hash_value(value: Any, seed: int = 0) -> int:
    """XXH64 of the canonical encoding of ``value``."""
    return hash_bytes(_encoded(value), seed)
