# cython: language_level=3
"""The head of a serialized DiscoveryRequest, read without parsing it (compiled twin).

Same contract as ``meshpilot.xds.request_head_py``, which documents it.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport uint8_t, uint64_t

FLAG_NODE = 1
FLAG_ERROR = 2
FLAG_FULL_PARSE = 4

cdef int _NODE = 1
cdef int _ERROR = 2
cdef int _FULL_PARSE = 4


cdef inline Py_ssize_t read_varint(const uint8_t *data, Py_ssize_t pos, Py_ssize_t end,
                                   uint64_t *out) except -1:
    cdef uint64_t value = 0
    cdef int shift = 0
    cdef uint8_t byte
    while True:
        if pos >= end or shift > 63:
            raise ValueError("truncated or overlong varint")
        byte = data[pos]
        pos += 1
        if shift == 63 and (byte & 0x7F) > 1:
            raise ValueError("varint overflows 64 bits")
        value |= (<uint64_t>(byte & 0x7F)) << shift
        if byte < 0x80:
            out[0] = value
            return pos
        shift += 7


def scan(bytes data):
    """The head of a serialized DiscoveryRequest (see ``request_head_py``)."""
    cdef const uint8_t *buf = <const uint8_t *>PyBytes_AS_STRING(data)
    cdef Py_ssize_t end = PyBytes_GET_SIZE(data)
    cdef Py_ssize_t pos = 0, field_start, names_start = -1, names_end = -1
    cdef Py_ssize_t names_count = 0
    cdef uint64_t key, length, ignored
    cdef int field, wire_type, flags = 0
    cdef str type_url = "", nonce = "", version = ""
    while pos < end:
        field_start = pos
        pos = read_varint(buf, pos, end, &key)
        field = <int>(key >> 3)
        wire_type = <int>(key & 7)
        if wire_type == 0:
            pos = read_varint(buf, pos, end, &ignored)
            flags |= _FULL_PARSE
            continue
        if wire_type == 1 or wire_type == 5:
            pos += 8 if wire_type == 1 else 4
            if pos > end:
                raise ValueError("truncated fixed-width field")
            flags |= _FULL_PARSE
            continue
        if wire_type != 2:
            raise ValueError(f"unsupported wire type {wire_type}")
        pos = read_varint(buf, pos, end, &length)
        if length > <uint64_t>(end - pos):
            raise ValueError("length beyond the end of the message")
        if field == 3:
            if names_count and names_end != field_start:
                flags |= _FULL_PARSE
            if not names_count:
                names_start = field_start
            names_end = pos + <Py_ssize_t>length
            names_count += 1
        elif field == 4:
            type_url = PyUnicode_DecodeUTF8(<const char *>buf + pos, <Py_ssize_t>length, NULL)
        elif field == 5:
            nonce = PyUnicode_DecodeUTF8(<const char *>buf + pos, <Py_ssize_t>length, NULL)
        elif field == 1:
            version = PyUnicode_DecodeUTF8(<const char *>buf + pos, <Py_ssize_t>length, NULL)
        elif field == 2:
            flags |= _NODE | _FULL_PARSE
        elif field == 6:
            flags |= _ERROR | _FULL_PARSE
        else:
            flags |= _FULL_PARSE
        pos += <Py_ssize_t>length
    if not names_count:
        names_start = names_end = 0
    return type_url, nonce, version, flags, names_start, names_end, names_count
