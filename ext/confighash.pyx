# cython: language_level=3
"""Stable 64-bit hashes of configs and proxy state (compiled twin).

Same contract as ``meshpilot.model.confighash_py``, which documents the
canonical encoding and is the typed source of truth; this module encodes into
a C buffer and runs XXH64 in C, so a hash costs no Python object per byte.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy

from protowire cimport Buffer, buf_free, buf_init, buf_reserve


cdef inline uint64_t rotl64(uint64_t x, int r) noexcept nogil:
    return (x << r) | (x >> (64 - r))

from google.protobuf.message import Message

cdef uint64_t P1 = 11400714785074694791ULL
cdef uint64_t P2 = 14029467366897019727ULL
cdef uint64_t P3 = 1609587929392839161ULL
cdef uint64_t P4 = 9650029242287828579ULL
cdef uint64_t P5 = 2870177450012600261ULL


cdef inline uint64_t read64(const uint8_t *p) noexcept nogil:
    # Little-endian load, independent of the host's byte order.
    return (<uint64_t>p[0] | (<uint64_t>p[1] << 8) | (<uint64_t>p[2] << 16)
            | (<uint64_t>p[3] << 24) | (<uint64_t>p[4] << 32) | (<uint64_t>p[5] << 40)
            | (<uint64_t>p[6] << 48) | (<uint64_t>p[7] << 56))


cdef inline uint32_t read32(const uint8_t *p) noexcept nogil:
    return (<uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16)
            | (<uint32_t>p[3] << 24))


cdef inline uint64_t xround(uint64_t acc, uint64_t lane) noexcept nogil:
    acc = acc + lane * P2
    return rotl64(acc, 31) * P1


cdef inline uint64_t merge_round(uint64_t acc, uint64_t val) noexcept nogil:
    acc ^= xround(0, val)
    return acc * P1 + P4


cdef uint64_t xxh64(const uint8_t *data, Py_ssize_t n, uint64_t seed) noexcept nogil:
    cdef Py_ssize_t pos = 0
    cdef uint64_t v1, v2, v3, v4, h
    if n >= 32:
        v1 = seed + P1 + P2
        v2 = seed + P2
        v3 = seed
        v4 = seed - P1
        while pos <= n - 32:
            v1 = xround(v1, read64(data + pos))
            v2 = xround(v2, read64(data + pos + 8))
            v3 = xround(v3, read64(data + pos + 16))
            v4 = xround(v4, read64(data + pos + 24))
            pos += 32
        h = rotl64(v1, 1) + rotl64(v2, 7) + rotl64(v3, 12) + rotl64(v4, 18)
        h = merge_round(h, v1)
        h = merge_round(h, v2)
        h = merge_round(h, v3)
        h = merge_round(h, v4)
    else:
        h = seed + P5
    h += <uint64_t>n
    while pos + 8 <= n:
        h ^= xround(0, read64(data + pos))
        h = rotl64(h, 27) * P1 + P4
        pos += 8
    if pos + 4 <= n:
        h ^= <uint64_t>read32(data + pos) * P1
        h = rotl64(h, 23) * P2 + P3
        pos += 4
    while pos < n:
        h ^= <uint64_t>data[pos] * P5
        h = rotl64(h, 11) * P1
        pos += 1
    h ^= h >> 33
    h *= P2
    h ^= h >> 29
    h *= P3
    h ^= h >> 32
    return h


cdef inline int put_tag(Buffer *buf, char tag) except -1:
    buf_reserve(buf, 1)
    buf.data[buf.size] = <uint8_t>tag
    buf.size += 1
    return 0


cdef int put_u32(Buffer *buf, Py_ssize_t value) except -1:
    cdef int i
    if value > 0xFFFFFFFF:
        raise OverflowError("value too large to hash")
    buf_reserve(buf, 4)
    for i in range(4):
        buf.data[buf.size + i] = <uint8_t>((<uint64_t>value >> (8 * i)) & 0xFF)
    buf.size += 4
    return 0


cdef int put_u64(Buffer *buf, uint64_t value) except -1:
    cdef int i
    buf_reserve(buf, 8)
    for i in range(8):
        buf.data[buf.size + i] = <uint8_t>((value >> (8 * i)) & 0xFF)
    buf.size += 8
    return 0


cdef int put_raw(Buffer *buf, const char *data, Py_ssize_t n) except -1:
    put_u32(buf, n)
    buf_reserve(buf, n)
    memcpy(buf.data + buf.size, data, n)
    buf.size += n
    return 0


cdef int put_bytes_object(Buffer *buf, bytes raw) except -1:
    return put_raw(buf, PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw))


cdef bytes encoded(object value):
    cdef Buffer buf
    buf_init(&buf)
    try:
        encode_into(&buf, value)
        return PyBytes_FromStringAndSize(<char *>buf.data, buf.size)
    finally:
        buf_free(&buf)


cdef object first(object entry):
    return entry[0]


cdef int encode_into(Buffer *buf, object value) except -1:
    cdef double d
    cdef uint64_t bits
    cdef int64_t i64
    cdef bytes raw
    cdef object item
    cdef list entries
    if value is None:
        return put_tag(buf, b'n')
    if value is True:
        return put_tag(buf, b't')
    if value is False:
        return put_tag(buf, b'f')
    if isinstance(value, str):
        raw = (<str>value).encode("utf-8", "surrogatepass")
        put_tag(buf, b's')
        return put_bytes_object(buf, raw)
    if isinstance(value, int):
        if -(1 << 63) <= value <= (1 << 63) - 1:
            i64 = value
            put_tag(buf, b'i')
            return put_u64(buf, <uint64_t>i64)
        raw = str(value).encode()
        put_tag(buf, b'I')
        return put_bytes_object(buf, raw)
    if isinstance(value, bytes):
        put_tag(buf, b'b')
        return put_bytes_object(buf, <bytes>value)
    if isinstance(value, (bytearray, memoryview)):
        put_tag(buf, b'b')
        return put_bytes_object(buf, bytes(value))
    if isinstance(value, float):
        d = value
        memcpy(&bits, &d, 8)
        put_tag(buf, b'd')
        return put_u64(buf, bits)
    if isinstance(value, (list, tuple)):
        put_tag(buf, b'l')
        put_u32(buf, len(value))
        for item in value:
            encode_into(buf, item)
        return 0
    if isinstance(value, dict):
        entries = [(encoded(k), v) for k, v in (<dict>value).items()]
        entries.sort(key=first)
        put_tag(buf, b'm')
        put_u32(buf, len(entries))
        for item in entries:
            raw = item[0]
            buf_reserve(buf, len(raw))
            memcpy(buf.data + buf.size, PyBytes_AS_STRING(raw), len(raw))
            buf.size += len(raw)
            encode_into(buf, item[1])
        return 0
    if isinstance(value, (set, frozenset)):
        entries = sorted([encoded(item) for item in value])
        put_tag(buf, b'S')
        put_u32(buf, len(entries))
        for raw in entries:
            buf_reserve(buf, len(raw))
            memcpy(buf.data + buf.size, PyBytes_AS_STRING(raw), len(raw))
            buf.size += len(raw)
        return 0
    if isinstance(value, Message):
        put_tag(buf, b'p')
        encode_into(buf, value.DESCRIPTOR.full_name)
        raw = value.SerializeToString(deterministic=True)
        put_tag(buf, b'b')
        return put_bytes_object(buf, raw)
    raise TypeError(f"cannot hash a value of type {type(value).__name__}")


def hash_bytes(data, seed=0):
    """XXH64 of ``data``; ``seed`` is taken modulo 2**64."""
    cdef const uint8_t[::1] view
    cdef uint64_t s = <uint64_t>(seed & 0xFFFFFFFFFFFFFFFF)
    if isinstance(data, bytes):
        return xxh64(<const uint8_t *>PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), s)
    view = data
    if view.shape[0] == 0:
        return xxh64(<const uint8_t *>b"", 0, s)
    return xxh64(&view[0], view.shape[0], s)


def encode_value(value):
    """The canonical encoding of ``value``."""
    return encoded(value)


def hash_value(value, seed=0):
    """XXH64 of the canonical encoding of ``value``."""
    cdef Buffer buf
    cdef uint64_t s = <uint64_t>(seed & 0xFFFFFFFFFFFFFFFF)
    buf_init(&buf)
    try:
        encode_into(&buf, value)
        if buf.size == 0:
            return xxh64(<const uint8_t *>b"", 0, s)
        return xxh64(buf.data, buf.size, s)
    finally:
        buf_free(&buf)
